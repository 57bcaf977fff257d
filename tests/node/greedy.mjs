// SPDX-License-Identifier: MIT
// llama.cpp as an oracle (through node-llama-cpp's prebuilt binary): greedy tokens for a list
// of jobs. Usage: node greedy.mjs JOBS.json  (jobs: [{model, prompt: [ids], n, ctx}])
// Prints a JSON array with one array of generated token ids per job.
import {getLlama} from "node-llama-cpp";
import {readFileSync} from "node:fs";

const jobs = JSON.parse(readFileSync(process.argv[2], "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const results = [];
for (const job of jobs) {
    const model = await llama.loadModel({modelPath: job.model});
    const context = await model.createContext({contextSize: job.ctx, threads: 1});
    const seq = context.getSequence();
    const out = [];
    for await (const t of seq.evaluate(job.prompt, {temperature: 0})) {
        out.push(t);
        if (out.length >= job.n || (job.stop !== undefined && t === job.stop))
            break;
    }
    results.push(out);
    await context.dispose();
    await model.dispose();
}
console.log(JSON.stringify(results));
process.exit(0);
