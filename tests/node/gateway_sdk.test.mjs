// ringlm-gateway through the official OpenAI SDK for Node: what an application written for
// the OpenAI API (or vLLM) sees. Run by tests/test_gateway_node.c against a real ringlmd and
// gateway; GATEWAY_URL, GATEWAY_KEY (a key of tenant alice), GATEWAY_TINY_KEY (a tenant
// whose 4-token queue quota refuses longer prompts) come from there.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.GATEWAY_URL + '/v1';
const client = new OpenAI({ baseURL, apiKey: process.env.GATEWAY_KEY, maxRetries: 0 });
const model = 'stories';

test('models.list names the served model', async () => {
  const page = await client.models.list();
  assert.deepEqual(page.data.map((m) => m.id), [model]);
});

test('completion: whole and streamed give the same text and usage', async () => {
  const req = { model, prompt: 'Once upon a time', max_tokens: 24, temperature: 0 };
  const whole = await client.completions.create(req);
  assert.equal(whole.object, 'text_completion');
  assert.equal(whole.choices[0].finish_reason, 'length');
  assert.equal(whole.usage.completion_tokens, 24);
  assert.equal(whole.usage.prompt_tokens, 5);
  assert.ok(whole.choices[0].text.length > 10);

  const stream = await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length) {
      text += chunk.choices[0].text;
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, whole.choices[0].text);
  assert.equal(finish, 'length');
  assert.deepEqual(usage, whole.usage);
});

test('usage.prompt_tokens_details.cached_tokens: a prompt sent again is served from the prefix cache', async () => {
  const req = {
    model,
    prompt: 'Lily and Tom went to the park. They saw a big red ball under a tall tree and ran to get it.',
    max_tokens: 4,
    temperature: 0,
  };
  const first = await client.completions.create(req);
  assert.equal(first.usage.prompt_tokens_details?.cached_tokens, 0);
  const again = await client.completions.create(req);
  const n = again.usage.prompt_tokens;
  // ringlmd caches whole 16-token blocks: all of them are found again
  assert.ok(n >= 16, `a prompt of ${n} tokens has no whole block`);
  assert.equal(again.usage.prompt_tokens_details?.cached_tokens, Math.floor(n / 16) * 16);
  const stream = await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let usage = null;
  for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
  assert.deepEqual(usage, again.usage);
});

test('chat: whole and streamed give the same message', async () => {
  const req = { model, messages: [{ role: 'user', content: 'Lily and Tom' }], max_tokens: 30, temperature: 0 };
  const whole = await client.chat.completions.create(req);
  assert.equal(whole.object, 'chat.completion');
  const msg = whole.choices[0].message;
  assert.equal(msg.role, 'assistant');
  assert.ok(msg.content.length > 10);
  const stream = await client.chat.completions.create({ ...req, stream: true });
  let content = '';
  let role = null;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    role = d.role ?? role;
    content += d.content ?? '';
  }
  assert.equal(role, 'assistant');
  assert.equal(content, msg.content);
});

test('a bad parameter is a BadRequestError naming it', async () => {
  await assert.rejects(client.completions.create({ model, prompt: 'x', n: 0 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.param, 'n');
    return true;
  });
});

test('an unknown key is an AuthenticationError', async () => {
  const bad = new OpenAI({ baseURL, apiKey: 'sk-not-a-key-at-all', maxRetries: 0 });
  await assert.rejects(bad.completions.create({ model, prompt: 'x' }), OpenAI.AuthenticationError);
});

test("a tenant over its quota is a RateLimitError with Retry-After", async () => {
  const tiny = new OpenAI({ baseURL, apiKey: process.env.GATEWAY_TINY_KEY, maxRetries: 0 });
  await assert.rejects(tiny.completions.create({ model, prompt: 'Once upon a time there was' }), (e) => {
    assert.ok(e instanceof OpenAI.RateLimitError, String(e));
    assert.equal(e.code, 'tenant_quota');
    assert.ok(e.headers.get('retry-after'));
    return true;
  });
});

test('a stream that fails before its first token is an error, not an empty stream', async () => {
  await assert.rejects(
    client.completions.create({ model, prompt: 'x', max_tokens: 600, stream: true }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'too_long',
  );
});
