// Log-probabilities through the official OpenAI SDK for Node: chat's
// choices[].logprobs.content[] (token, logprob, bytes, top_logprobs) and completions'
// choices[].logprobs (tokens, token_logprobs, top_logprobs, text_offset), whole and streamed,
// echo with max_tokens 0 (lm-evaluation-harness's scoring request), vLLM's prompt_logprobs,
// and 400s for counts out of range. Run by tests/test_gateway_node.c (GATEWAY_URL, GATEWAY_KEY).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.GATEWAY_URL + '/v1', apiKey: process.env.GATEWAY_KEY, maxRetries: 0 });
const model = 'stories';

// A ChatCompletionTokenLogprob as the SDK types it.
function checkChatEntry(e, top) {
  assert.equal(typeof e.token, 'string');
  assert.equal(typeof e.logprob, 'number');
  assert.ok(e.logprob <= 0, `logprob ${e.logprob}`);
  assert.ok(Array.isArray(e.bytes) && e.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256));
  assert.equal(Buffer.from(e.bytes).toString('utf8').replace(/\uFFFD/g, ''), e.token.replace(/\uFFFD/g, ''));
  assert.ok(Array.isArray(e.top_logprobs));
  assert.equal(e.top_logprobs.length, top);
  for (let i = 0; i < e.top_logprobs.length; i++) {
    const t = e.top_logprobs[i];
    assert.equal(typeof t.token, 'string');
    assert.equal(typeof t.logprob, 'number');
    assert.ok(Array.isArray(t.bytes));
    if (i > 0) assert.ok(t.logprob <= e.top_logprobs[i - 1].logprob, 'best first');
  }
}

test('chat: logprobs and top_logprobs, whole and streamed, agree', async () => {
  const req = {
    model,
    messages: [{ role: 'user', content: 'Lily and Tom' }],
    max_tokens: 12,
    temperature: 0,
    logprobs: true,
    top_logprobs: 3,
    ignore_eos: true,
  };
  const whole = await client.chat.completions.create(req);
  const lp = whole.choices[0].logprobs;
  assert.ok(lp && Array.isArray(lp.content), JSON.stringify(whole.choices[0]));
  assert.equal(lp.content.length, whole.usage.completion_tokens);
  for (const e of lp.content) {
    checkChatEntry(e, 3);
    // greedy: the token is the most likely one
    assert.equal(e.logprob, e.top_logprobs[0].logprob);
  }
  assert.equal(lp.content.map((e) => e.token).join(''), whole.choices[0].message.content);

  const stream = await client.chat.completions.create({ ...req, stream: true });
  const streamed = [];
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (c?.logprobs?.content) streamed.push(...c.logprobs.content);
  }
  assert.deepEqual(streamed, lp.content);
});

test('completions: logprobs N, whole and streamed, agree', async () => {
  const req = { model, prompt: 'Once upon a time', max_tokens: 10, temperature: 0, logprobs: 2, ignore_eos: true };
  const whole = await client.completions.create(req);
  const lp = whole.choices[0].logprobs;
  assert.ok(lp, JSON.stringify(whole.choices[0]));
  assert.equal(lp.tokens.length, 10);
  assert.equal(lp.token_logprobs.length, 10);
  assert.equal(lp.top_logprobs.length, 10);
  assert.equal(lp.text_offset.length, 10);
  assert.equal(lp.tokens.join(''), whole.choices[0].text);
  for (let i = 0; i < 10; i++) {
    assert.equal(typeof lp.token_logprobs[i], 'number');
    const alts = Object.entries(lp.top_logprobs[i]);
    assert.ok(alts.length >= 1 && alts.length <= 2);
    assert.equal(Math.max(...alts.map(([, v]) => v)), lp.token_logprobs[i], 'greedy: the top one');
    if (i > 0) assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + lp.tokens[i - 1].length);
  }
  const stream = await client.completions.create({ ...req, stream: true });
  const tokens = [];
  const lps = [];
  for await (const chunk of stream) {
    const l = chunk.choices[0]?.logprobs;
    if (l) {
      tokens.push(...l.tokens);
      lps.push(...l.token_logprobs);
    }
  }
  assert.deepEqual(tokens, lp.tokens);
  assert.deepEqual(lps, lp.token_logprobs);
});

test('completions: echo with logprobs 1 and max_tokens 0 scores the prompt (lm-eval)', async () => {
  const prompt = 'Once upon a time there was a little girl';
  const r = await client.completions.create({ model, prompt, max_tokens: 0, echo: true, logprobs: 1 });
  const c = r.choices[0];
  assert.equal(c.text, prompt);
  assert.equal(c.finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 0);
  const lp = c.logprobs;
  assert.equal(lp.tokens.length, r.usage.prompt_tokens);
  assert.equal(lp.token_logprobs[0], null, 'nothing predicts the first token');
  assert.equal(lp.top_logprobs[0], null);
  for (let i = 1; i < lp.tokens.length; i++) {
    assert.equal(typeof lp.token_logprobs[i], 'number');
    assert.ok(lp.token_logprobs[i] <= 0);
  }
  // the same prompt with one generated token: the same prompt scores
  const more = await client.completions.create({ model, prompt, max_tokens: 1, echo: true, logprobs: 1, temperature: 0 });
  const ml = more.choices[0].logprobs;
  assert.equal(ml.tokens.length, lp.tokens.length + 1);
  assert.deepEqual(ml.token_logprobs.slice(0, lp.tokens.length), lp.token_logprobs);
  assert.ok(more.choices[0].text.startsWith(prompt));
});

test("vLLM's prompt_logprobs", async () => {
  const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 1, prompt_logprobs: 2 });
  const p = r.choices[0].prompt_logprobs;
  assert.ok(Array.isArray(p), JSON.stringify(r.choices[0]));
  assert.equal(p.length, r.usage.prompt_tokens);
  assert.equal(p[0], null);
  for (const d of p.slice(1)) {
    const entries = Object.entries(d);
    assert.ok(entries.length >= 2 && entries.length <= 3);
    for (const [id, v] of entries) {
      assert.ok(/^\d+$/.test(id));
      assert.equal(typeof v.logprob, 'number');
      assert.ok(Number.isInteger(v.rank) && v.rank >= 1);
      assert.equal(typeof v.decoded_token, 'string');
    }
  }
});

test('counts out of range are BadRequestErrors naming the field', async () => {
  // each request made when its check awaits it: made all at once, a later one's rejection
  // could arrive before its handler was attached (an unhandled rejection, a failed test)
  const cases = [
    [() => client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], logprobs: true, top_logprobs: 21 }), 'top_logprobs'],
    [() => client.completions.create({ model, prompt: 'x', logprobs: 21 }), 'logprobs'],
    [() => client.completions.create({ model, prompt: 'x', logprobs: -1 }), 'logprobs'],
    [() => client.completions.create({ model, prompt: 'x', prompt_logprobs: 21 }), 'prompt_logprobs'],
  ];
  for (const [request, param] of cases) {
    await assert.rejects(request(), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.param, param);
      return true;
    });
  }
});
