// SPDX-License-Identifier: MIT
// llama.cpp as an oracle (through node-llama-cpp's prebuilt binary): the log-probabilities of
// the next token at every position of given token sequences (teacher-forced, one batch).
// Usage: node logprobs.mjs JOBS.json  (jobs: [{model, tokens: [ids], from, top, ctx}])
// Prints a JSON array with, per job, one entry per position p >= from: the `top` most likely
// next tokens after tokens[0..p] as [[id, log p], ...], most likely first.
import {getLlama} from "node-llama-cpp";
import {readFileSync} from "node:fs";

const jobs = JSON.parse(readFileSync(process.argv[2], "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const results = [];
for (const job of jobs) {
    const model = await llama.loadModel({modelPath: job.model});
    const context = await model.createContext({contextSize: job.ctx, threads: 1});
    const seq = context.getSequence();
    const input = job.tokens.map((t, p) => p >= job.from
        ? [t, {generateNext: {probabilities: true, options: {temperature: 1, topK: 0, topP: 1, minP: 0}}}]
        : t);
    const out = await seq.controlledEvaluate(input);
    const rows = [];
    for (let p = job.from; p < job.tokens.length; p++) {
        const probs = out[p]?.next?.probabilities;
        const top = [];
        if (probs)
            for (const [tok, pr] of probs) {
                top.push([tok, Math.log(pr)]);
                if (top.length >= job.top) break;
            }
        rows.push(top);
    }
    results.push(rows);
    await context.dispose();
    await model.dispose();
}
console.log(JSON.stringify(results));
process.exit(0);
