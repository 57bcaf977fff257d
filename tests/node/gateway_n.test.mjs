// n choices of one prompt through the official OpenAI SDK for Node: `n: 3` on completions and
// chat, whole and streamed — choices[i].index 0..n-1, each choice's text equal to a single
// request with seed + i (ringlmd's rule), the streamed chunks of each index adding up to the
// whole answer's choice, usage counting the prompt once and every choice's tokens; best_of
// (completions) answers the n samples of the highest cumulative log-probability; out-of-range
// n and best_of are 400s naming the field; n with echo and logprobs gives every choice the
// prompt's log-probabilities (computed once), whole and streamed. Run by
// tests/test_gateway_node.c (GATEWAY_URL, GATEWAY_KEY).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.GATEWAY_URL + '/v1', apiKey: process.env.GATEWAY_KEY, maxRetries: 0 });
const model = 'stories';
const N = 3;

function checkIndices(choices) {
  assert.equal(choices.length, N);
  assert.deepEqual(choices.map((c) => c.index), [...Array(N).keys()]);
}

test('completions: n 3, whole and streamed, each choice as a single request with seed + i', async () => {
  const req = { model, prompt: 'Once upon a time', max_tokens: 12, temperature: 1.0, seed: 77, ignore_eos: true };
  const whole = await client.completions.create({ ...req, n: N });
  checkIndices(whole.choices);
  const singles = [];
  for (let i = 0; i < N; i++) {
    const one = await client.completions.create({ ...req, seed: 77 + i });
    singles.push(one);
    assert.equal(whole.choices[i].text, one.choices[0].text, `choice ${i} vs seed ${77 + i}`);
    assert.equal(whole.choices[i].finish_reason, 'length');
  }
  assert.ok(new Set(whole.choices.map((c) => c.text)).size > 1, 'three samples, one text');
  // the prompt once, every choice's tokens
  assert.equal(whole.usage.prompt_tokens, singles[0].usage.prompt_tokens);
  assert.equal(whole.usage.completion_tokens, N * 12);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + N * 12);

  const stream = await client.completions.create({ ...req, n: N, stream: true, stream_options: { include_usage: true } });
  const texts = Array(N).fill('');
  const finishes = Array(N).fill(null);
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      assert.ok(c.index >= 0 && c.index < N, `index ${c.index}`);
      texts[c.index] += c.text;
      if (c.finish_reason) finishes[c.index] = c.finish_reason;
    }
  }
  assert.deepEqual(texts, whole.choices.map((c) => c.text));
  assert.deepEqual(finishes, Array(N).fill('length'));
  assert.ok(usage, 'include_usage: a usage chunk');
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
  assert.equal(usage.completion_tokens, N * 12);
});

test('chat: n 3, whole and streamed, agree', async () => {
  const req = { model, messages: [{ role: 'user', content: 'Lily and Tom' }], max_tokens: 10, temperature: 1.0, seed: 5, ignore_eos: true };
  const whole = await client.chat.completions.create({ ...req, n: N });
  checkIndices(whole.choices);
  for (let i = 0; i < N; i++) {
    assert.equal(whole.choices[i].message.role, 'assistant');
    assert.equal(typeof whole.choices[i].message.content, 'string');
    const one = await client.chat.completions.create({ ...req, seed: 5 + i });
    assert.equal(whole.choices[i].message.content, one.choices[0].message.content, `choice ${i}`);
  }
  assert.equal(whole.usage.completion_tokens, N * 10);

  const stream = await client.chat.completions.create({ ...req, n: N, stream: true });
  const texts = Array(N).fill('');
  const roles = Array(N).fill(null);
  const finishes = Array(N).fill(null);
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta?.role) roles[c.index] = c.delta.role;
      if (c.delta?.content) texts[c.index] += c.delta.content;
      if (c.finish_reason) finishes[c.index] = c.finish_reason;
    }
  }
  assert.deepEqual(roles, Array(N).fill('assistant'));
  assert.deepEqual(texts, whole.choices.map((c) => c.message.content));
  assert.deepEqual(finishes, Array(N).fill('length'));
});

test('completions: best_of answers the n samples of the highest cumulative log-probability', async () => {
  const req = { model, prompt: 'The little dog', max_tokens: 8, temperature: 1.0, seed: 300, ignore_eos: true };
  const all = await client.completions.create({ ...req, n: 4, logprobs: 0 });
  const sums = all.choices.map((c) => c.logprobs.token_logprobs.reduce((a, b) => a + b, 0));
  const best = await client.completions.create({ ...req, n: 2, best_of: 4, logprobs: 0 });
  assert.equal(best.choices.length, 2);
  assert.deepEqual(best.choices.map((c) => c.index), [0, 1]);
  const order = sums.map((s, i) => [s, i]).sort((a, b) => b[0] - a[0] || a[1] - b[1]);
  assert.equal(best.choices[0].text, all.choices[order[0][1]].text);
  assert.equal(best.choices[1].text, all.choices[order[1][1]].text);
  // without logprobs asked, none are shown
  const plain = await client.completions.create({ ...req, n: 1, best_of: 4 });
  assert.equal(plain.choices.length, 1);
  assert.equal(plain.choices[0].logprobs, null);
  assert.equal(plain.choices[0].text, best.choices[0].text);
});

test('n and best_of out of range are 400s naming the field', async () => {
  for (const [body, param] of [
    [{ n: 0 }, 'n'],
    [{ n: 17 }, 'n'],
    [{ n: 3, best_of: 2 }, 'best_of'],
    [{ n: 1, best_of: 2, stream: true }, 'best_of'],
  ]) {
    await assert.rejects(
      client.completions.create({ model, prompt: 'x', max_tokens: 2, ...body }),
      (e) => e.status === 400 && e.param === param,
      JSON.stringify(body),
    );
  }
});

test('completions: n 3 with echo and logprobs, the prompt scored once and given to every choice', async () => {
  const req = { model, prompt: 'Once upon a time', max_tokens: 4, temperature: 1.0, seed: 11, ignore_eos: true, echo: true, logprobs: 1 };
  const one = await client.completions.create(req);
  const np = one.choices[0].logprobs.tokens.length - 4;
  assert.ok(np > 1, `prompt tokens ${np}`);
  const whole = await client.completions.create({ ...req, n: N });
  checkIndices(whole.choices);
  for (let i = 0; i < N; i++) {
    const c = whole.choices[i];
    assert.ok(c.text.startsWith('Once upon a time'), `choice ${i} echoes: ${c.text}`);
    assert.equal(c.logprobs.tokens.length, np + 4, `choice ${i}`);
    assert.deepEqual(c.logprobs.tokens.slice(0, np), one.choices[0].logprobs.tokens.slice(0, np));
    assert.equal(c.logprobs.token_logprobs[0], null, 'the first prompt token has none');
    for (let k = 1; k < np; k++)
      assert.ok(Math.abs(c.logprobs.token_logprobs[k] - one.choices[0].logprobs.token_logprobs[k]) < 1e-4,
        `choice ${i} prompt token ${k}`);
    const single = await client.completions.create({ ...req, seed: 11 + i });
    assert.equal(c.text, single.choices[0].text, `choice ${i} vs seed ${11 + i}`);
  }
  const stream = await client.completions.create({ ...req, n: N, stream: true });
  const texts = Array(N).fill('');
  const echoLps = Array(N).fill(null);
  for await (const chunk of stream)
    for (const c of chunk.choices) {
      if (echoLps[c.index] === null) echoLps[c.index] = c.logprobs ? c.logprobs.tokens.length : -1;
      texts[c.index] += c.text;
    }
  assert.deepEqual(texts, whole.choices.map((c) => c.text));
  assert.deepEqual(echoLps, Array(N).fill(np), 'each choice streams the echoed prompt with its log-probabilities first');
});
