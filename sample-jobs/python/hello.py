"""`hello` in Python: the smallest well-behaved job, as a GLUE_PYTHON handler.

Contract (the job world of wit/job.wit, as componentize-py presents it):
- the module defines a class `WitWorld` with a method `run(self, t)`; `t` is the trigger
  (`t.job_id`, `t.log_id`, `t.param`, `t.shard_index`, `t.shard_total`, `t.trigger_time_ms`,
  `t.attempt`);
- returning a string ends the run as a success with that handle message;
- raising `componentize_py_types.Err("message")` ends it as a failure with that message
  (any other exception is a failure too, reported as a trap);
- `log(Level.INFO, "text")` appends a line to the run's log; `print` goes there as well.

Here: param = a name (empty means `world`). Logs `hello, <name>` at info level and returns
`hello, <name>`; the param `fail` makes it fail with `asked to fail`.
"""

import wit_world
from componentize_py_types import Err
from wit_world.imports.log import Level, log
from wit_world.imports.types import Trigger


class WitWorld(wit_world.WitWorld):
    def run(self, t: Trigger) -> str:
        if t.param == "fail":
            raise Err("asked to fail")
        message = f"hello, {t.param or 'world'}"
        log(Level.INFO, message)
        return message
