// SPDX-License-Identifier: MIT
// Chat templates rendered by @huggingface/jinja, the oracle of tests/test_jinja_oracle.c (and
// of model/jinja.c's byte-for-byte claim).
// Usage: node jinja.mjs JOB.json   (job: {cases: [{template: "...", vars: {...}}]})
// Prints [{text: "..."} or {error: "..."}], one per case, in order: the rendered text, or the
// message of what the template raised or why it did not parse.
import {readFileSync} from "node:fs";
import {Template} from "@huggingface/jinja";

const job = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = job.cases.map(({template, vars}) => {
    try {
        return {text: new Template(template).render(vars ?? {})};
    } catch (e) {
        return {error: String(e?.message ?? e)};
    }
});
console.log(JSON.stringify(out));
process.exit(0);
