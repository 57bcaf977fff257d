// Structured output through the official OpenAI SDK for Node: chat with
// response_format json_schema (strict), whole and streamed: every answer that finishes with
// "stop" is JSON that has the schema's shape, with n: 4 each choice on its own; a schema ringlm cannot enforce is a
// BadRequestError (400) naming response_format with ringlmd's words. Run by
// tests/test_gateway_node.c (GATEWAY_URL, GATEWAY_KEY, NO_WS_BIAS: a logit_bias object that
// keeps a tiny model from wandering in whitespace).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.GATEWAY_URL + '/v1', apiKey: process.env.GATEWAY_KEY, maxRetries: 0 });
const model = 'stories';
const logit_bias = JSON.parse(process.env.NO_WS_BIAS || '{}');

const schema = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 10 },
    age: { type: 'integer', minimum: 1, maximum: 99 },
    pet: { enum: ['dog', 'cat'] },
  },
  required: ['name', 'age', 'pet'],
  additionalProperties: false,
};
const response_format = { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } };

function checkPerson(text) {
  const v = JSON.parse(text);
  assert.deepEqual(Object.keys(v), ['name', 'age', 'pet'], text);
  assert.equal(typeof v.name, 'string');
  assert.ok([...v.name].length <= 10, text);
  assert.ok(Number.isInteger(v.age) && v.age >= 1 && v.age <= 99, text);
  assert.ok(v.pet === 'dog' || v.pet === 'cat', text);
}

function req(seed) {
  return {
    model,
    messages: [{ role: 'user', content: 'Who is Lily?' }],
    max_tokens: 200,
    temperature: 1,
    seed,
    logit_bias,
    response_format,
  };
}

test('chat: response_format json_schema, whole and streamed', async () => {
  let finished = 0;
  for (let seed = 1; seed <= 4; seed++) {
    const whole = await client.chat.completions.create(req(seed));
    const c = whole.choices[0];
    assert.ok(c.finish_reason === 'stop' || c.finish_reason === 'length', c.finish_reason);
    if (c.finish_reason === 'stop') {
      checkPerson(c.message.content);
      finished++;
    }
    // streamed with the same seed: the same answer, in deltas
    const stream = await client.chat.completions.create({ ...req(seed), stream: true });
    let text = '';
    let finish = null;
    for await (const chunk of stream) {
      const d = chunk.choices[0];
      if (d?.delta?.content) text += d.delta.content;
      if (d?.finish_reason) finish = d.finish_reason;
    }
    assert.equal(finish, c.finish_reason);
    assert.equal(text, c.message.content);
  }
  assert.ok(finished >= 2, `only ${finished} of 4 answers finished`);
});

test('n: 4 with response_format: every choice follows the schema on its own', async () => {
  // the schema is bounded (a name of at most 10 characters, a two-digit age, one of two pets),
  // so each of the 4 samples ends within max_tokens and each must validate
  const whole = await client.chat.completions.create({ ...req(11), n: 4 });
  assert.equal(whole.choices.length, 4);
  const texts = [];
  for (const c of whole.choices) {
    assert.equal(c.finish_reason, 'stop', `choice ${c.index}: ${c.message.content}`);
    checkPerson(c.message.content);
    texts[c.index] = c.message.content;
  }
  assert.ok(new Set(texts).size > 1, `4 samples at temperature 1 gave one answer: ${texts[0]}`);
  // streamed: the same 4 answers, each in the deltas of its index
  const stream = await client.chat.completions.create({ ...req(11), n: 4, stream: true });
  const got = ['', '', '', ''];
  const finish = [null, null, null, null];
  for await (const chunk of stream) {
    for (const d of chunk.choices) {
      if (d.delta?.content) got[d.index] += d.delta.content;
      if (d.finish_reason) finish[d.index] = d.finish_reason;
    }
  }
  assert.deepEqual(got, texts);
  assert.deepEqual(finish, ['stop', 'stop', 'stop', 'stop']);
});

test('a schema ringlm cannot enforce is a 400 naming response_format', async () => {
  const bad = { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', not: { minProperties: 2 } } } };
  await assert.rejects(
    client.chat.completions.create({ ...req(1), response_format: bad }),
    (err) => {
      assert.ok(err instanceof OpenAI.BadRequestError, String(err));
      assert.equal(err.status, 400);
      assert.equal(err.param, 'response_format');
      assert.match(err.message, /constraint: .*not/);
      return true;
    },
  );
  await assert.rejects(
    client.chat.completions.create({ ...req(1), response_format: bad, stream: true }),
    (err) => err instanceof OpenAI.BadRequestError && err.param === 'response_format',
  );
});
