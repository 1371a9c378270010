-- The partial index of every unfinished run tested each row it might hold with
-- `state in ('pending', 'dispatching', 'running')`. SQLite evaluates a list of three or more
-- constants through a temporary table that it builds for every row an insert or an update
-- touches: with this index, a run's insert and its two transitions cost about a quarter more
-- than without it. Its one hot reader, admission's capped count of unfinished runs, now adds up
-- the partial indexes the sweeps keep (pending runs, held runs, and the runs in flight). Spelled
-- with `or` instead, the index would have been cheaper to keep, but a query for one unfinished
-- state would have implied it, and SQLite's planner then preferred it to those sweeps' own
-- indexes.
drop index runs_unfinished;
