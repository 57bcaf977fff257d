// ringlm-gateway's tools and Responses API through the official OpenAI SDK for Node: the
// typed shapes an application sees. Run by tests/test_gateway_responses.c against a real
// ringlmd and a gateway whose tokenizer has a Hermes-style chat template; GATEWAY_URL from
// there.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.GATEWAY_URL + '/v1', apiKey: 'none', maxRetries: 0 });
const model = 'stories';
const tools = [
  {
    type: 'function',
    function: { name: 'get_time', description: 'The time', parameters: { type: 'object', properties: { tz: { type: 'string' } } } },
  },
];

test('chat.completions.create with tools: the message whole and streamed', async () => {
  const req = { model, messages: [{ role: 'user', content: 'Lily and Tom' }], tools, tool_choice: 'auto', max_tokens: 16, temperature: 0 };
  const whole = await client.chat.completions.create(req);
  const msg = whole.choices[0].message;
  assert.equal(msg.role, 'assistant');
  assert.ok(msg.content.length > 5);
  assert.equal(msg.tool_calls, undefined);
  assert.equal(whole.choices[0].finish_reason, 'length');
  const stream = await client.chat.completions.create({ ...req, stream: true });
  let content = '';
  let calls = 0;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    content += d.content ?? '';
    calls += d.tool_calls?.length ?? 0;
  }
  assert.equal(content, msg.content);
  assert.equal(calls, 0);
});

test('chat: a conversation with a tool call and its result goes through the template', async () => {
  const res = await client.chat.completions.create({
    model,
    tools,
    max_tokens: 4,
    messages: [
      { role: 'user', content: 'What time is it?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_time', arguments: '{"tz":"UTC"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'noon' },
    ],
  });
  assert.equal(res.object, 'chat.completion');
  assert.ok(res.usage.prompt_tokens > 40);
});

test('responses.create: a typed response with output_text', async () => {
  const r = await client.responses.create({ model, instructions: 'Tell a story.', input: 'Once upon a time', max_output_tokens: 16, temperature: 0 });
  assert.equal(r.object, 'response');
  assert.ok(r.id.startsWith('resp_'));
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].role, 'assistant');
  assert.equal(r.output[0].content[0].type, 'output_text');
  assert.ok(r.output_text.length > 5);
  assert.equal(r.usage.output_tokens, 16);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + 16);
});

test('responses.create streamed: the events join to the same text', async () => {
  const req = { model, instructions: 'Tell a story.', input: 'Once upon a time', max_output_tokens: 16, temperature: 0 };
  const whole = await client.responses.create(req);
  const stream = await client.responses.create({ ...req, stream: true });
  let text = '';
  const types = [];
  let completed = null;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed') completed = ev.response;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types.at(-1), 'response.completed');
  assert.equal(text, whole.output_text);
  assert.equal(completed.output[0].content[0].text, whole.output_text);
  // the SDK's stream helper builds the final response from the same events
  const helper = client.responses.stream(req);
  const final = await helper.finalResponse();
  assert.equal(final.status, 'incomplete');
  assert.equal(final.output[0].content[0].text, whole.output_text);
});

test('responses.create: input items and function tools', async () => {
  const r = await client.responses.create({
    model,
    max_output_tokens: 4,
    tools: [{ type: 'function', name: 'get_time', parameters: { type: 'object', properties: {} }, strict: false }],
    input: [
      { role: 'user', content: 'What time is it?' },
      { type: 'function_call', call_id: 'call_1', name: 'get_time', arguments: '{}' },
      { type: 'function_call_output', call_id: 'call_1', output: 'noon' },
    ],
  });
  assert.equal(r.object, 'response');
  assert.ok(r.usage.input_tokens > 30);
  assert.equal(r.tools[0].name, 'get_time');
});

test('bad tools and input items are BadRequestErrors naming the field', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'function', function: { description: 'x' } }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools',
  );
  await assert.rejects(
    client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], tools, tool_choice: { type: 'function', function: { name: 'nope' } } }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'tool_choice',
  );
  await assert.rejects(
    client.responses.create({ model, input: [{ type: 'item_reference', id: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'input' && /item_reference/.test(e.message),
  );
  await assert.rejects(
    client.responses.create({ model, input: 'hi', store: true }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'store',
  );
});
