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

// tool_choice "required" and a named function constrain the answer to calls; the whitespace
// bias (GATEWAY_WS_BIAS: -100 for stories260K's whitespace tokens) keeps a greedy stories260K
// from wandering in the whitespace JSON allows.
const wsBias = JSON.parse(process.env.GATEWAY_WS_BIAS ?? '{}');
const tightTools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      parameters: { type: 'object', properties: { city: { enum: ['Paris', 'Oslo'] } }, required: ['city'], additionalProperties: false },
    },
  },
  {
    type: 'function',
    function: {
      name: 'get_time',
      parameters: { type: 'object', properties: { tz: { enum: ['UTC', 'CET'] } }, required: ['tz'], additionalProperties: false },
    },
  },
];

test('chat: a named function and "required" come back as typed tool_calls, whole and streamed', async () => {
  const base = { model, messages: [{ role: 'user', content: 'Weather?' }], tools: tightTools, temperature: 0, max_tokens: 120, logit_bias: wsBias };
  const named = await client.chat.completions.create({ ...base, tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  const m = named.choices[0].message;
  assert.equal(m.content, null);
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].type, 'function');
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.ok(['Paris', 'Oslo'].includes(JSON.parse(m.tool_calls[0].function.arguments).city));
  assert.equal(named.choices[0].finish_reason, 'stop');

  const req = { ...base, tool_choice: 'required', parallel_tool_calls: false };
  const whole = await client.chat.completions.create(req);
  const calls = whole.choices[0].message.tool_calls;
  assert.equal(calls.length, 1);
  assert.equal(whole.choices[0].finish_reason, 'tool_calls');
  const args = JSON.parse(calls[0].function.arguments);
  assert.ok(calls[0].function.name === 'get_weather' ? ['Paris', 'Oslo'].includes(args.city) : ['UTC', 'CET'].includes(args.tz));
  // the SDK's stream helper reassembles the deltas into the same calls
  const stream = client.chat.completions.stream(req);
  const final = await stream.finalChatCompletion();
  const fcalls = final.choices[0].message.tool_calls;
  assert.equal(fcalls.length, 1);
  assert.ok(fcalls[0].id.startsWith('call_'));
  assert.equal(fcalls[0].function.name, calls[0].function.name);
  assert.equal(fcalls[0].function.arguments, calls[0].function.arguments);
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
});

test('responses.create: tool_choice required gives typed function_call items', async () => {
  const r = await client.responses.create({
    model,
    input: 'Weather?',
    temperature: 0,
    max_output_tokens: 120,
    tools: tightTools.map((t) => ({ type: 'function', ...t.function, strict: true })),
    tool_choice: 'required',
    parallel_tool_calls: false,
  });
  // a Responses request has no logit_bias: a greedy stories260K may wander in JSON's
  // whitespace to max_output_tokens, cutting the call short; what came out is calls only
  if (r.status === 'completed') assert.equal(r.output.length, 1);
  else assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  for (const fc of r.output) {
    assert.equal(fc.type, 'function_call');
    assert.ok(['get_weather', 'get_time'].includes(fc.name));
    assert.ok(fc.call_id.startsWith('call_'));
    assert.equal(typeof fc.arguments, 'string');
  }
});
