// Builds one JavaScript job handler into a component with componentize-js's library API.
//
// Usage, from the scratch directory that holds the source:
//   node componentize.mjs <componentize-js entry> <source.mjs> <wit path> <world> <out.wasm>
// The admin writes this file next to the source and runs it there, with no environment but a
// fixed PATH and HOME (the scratch directory). A syntax error is reported
// by `node --check` first (componentize-js names no line for it); any error ends the process
// with status 1 and its message on stderr.
import { spawnSync } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { pathToFileURL } from "node:url";

const [entry, sourcePath, witPath, worldName, outPath] = process.argv.slice(2);
const check = spawnSync(process.execPath, ["--check", sourcePath], { encoding: "utf8" });
if (check.status !== 0) {
  process.stderr.write(check.stderr || "the source does not parse\n");
  process.exit(1);
}
try {
  const { componentize } = await import(pathToFileURL(entry).href);
  const { component } = await componentize({
    sourcePath,
    witPath,
    worldName,
    // No fetch() and no fetch event: the job world has no HTTP interface, and the host would
    // refuse the wasi:http imports either feature pulls in.
    disableFeatures: ["http", "fetch-event"],
    // Wizer's only environment (and its guest's): a home for its compilation cache, which is
    // the build's scratch directory, so no build reads code another one left.
    env: { HOME: process.env.HOME },
  });
  await writeFile(outPath, component);
} catch (error) {
  process.stderr.write(`${error && error.message ? error.message : error}\n`);
  process.exit(1);
}
