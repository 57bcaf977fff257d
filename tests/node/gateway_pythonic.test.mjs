// Pythonic tool calls constrained through the official OpenAI SDK for Node: a gateway whose
// chat template writes calls as a Python list ([get_time(tz="UTC")], the pythonic parser)
// answers tool_choice "required" and a named function with that syntax, constrained to the
// functions' parameter schemas, and gives them back as tool_calls whose arguments are JSON
// objects of those schemas — whole and streamed alike. Run by tests/test_gateway_pythonic.c
// (GATEWAY_URL; NO_WS_BIAS: a logit_bias object that keeps a tiny greedy model out of the
// whitespace Python allows).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.GATEWAY_URL + '/v1', apiKey: 'none', maxRetries: 0 });
const model = 'stories';
const logit_bias = JSON.parse(process.env.NO_WS_BIAS || '{}');

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_time',
      parameters: {
        type: 'object',
        properties: { tz: { enum: ['UTC', 'CET'] }, exact: { type: 'boolean' } },
        required: ['tz', 'exact'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'get_weather',
      parameters: {
        type: 'object',
        properties: {
          city: { enum: ['Paris', 'Oslo'] },
          days: { type: 'integer', minimum: 1, maximum: 3 },
          unit: { enum: [null, 'C'] },
        },
        required: ['city', 'days', 'unit'],
        additionalProperties: false,
      },
    },
  },
];

function checkCall(name, args) {
  const a = JSON.parse(args);
  if (name === 'get_time') {
    assert.deepEqual(Object.keys(a), ['tz', 'exact'], args);
    assert.ok(a.tz === 'UTC' || a.tz === 'CET', args);
    assert.equal(typeof a.exact, 'boolean', args);
  } else {
    assert.equal(name, 'get_weather');
    assert.deepEqual(Object.keys(a), ['city', 'days', 'unit'], args);
    assert.ok(a.city === 'Paris' || a.city === 'Oslo', args);
    assert.ok(Number.isInteger(a.days) && a.days >= 1 && a.days <= 3, args);
    assert.ok(a.unit === null || a.unit === 'C', args);
  }
}

function req(more) {
  return {
    model,
    messages: [{ role: 'user', content: 'What time is it?' }],
    tools,
    max_tokens: 120,
    temperature: 0,
    logit_bias,
    ...more,
  };
}

// The whole answer, then the streamed one reassembled from its deltas: the same calls.
async function sameCalls(more) {
  const whole = await client.chat.completions.create(req(more));
  const c = whole.choices[0];
  assert.equal(c.message.content, null, JSON.stringify(c.message));
  const calls = c.message.tool_calls ?? [];
  const stream = await client.chat.completions.create({ ...req(more), stream: true });
  const got = [];
  let finish = null;
  let content = '';
  for await (const chunk of stream) {
    const d = chunk.choices[0];
    if (d?.delta?.content) content += d.delta.content;
    for (const tc of d?.delta?.tool_calls ?? []) {
      if (!got[tc.index]) {
        assert.ok(tc.id, JSON.stringify(tc));
        got[tc.index] = { name: tc.function.name, args: '' };
      }
      got[tc.index].args += tc.function.arguments ?? '';
    }
    if (d?.finish_reason) finish = d.finish_reason;
  }
  assert.equal(content, '', 'a constrained answer has no content');
  assert.equal(finish, c.finish_reason);
  assert.equal(got.length, calls.length, JSON.stringify({ got, calls }));
  calls.forEach((call, i) => {
    assert.ok(call.id.startsWith('call_'), call.id);
    assert.equal(got[i].name, call.function.name);
    assert.equal(got[i].args, call.function.arguments);
  });
  return { calls, finish: c.finish_reason };
}

test('tool_choice required, one call: a call of one of the tools', async () => {
  const { calls, finish } = await sameCalls({ tool_choice: 'required', parallel_tool_calls: false });
  assert.equal(finish, 'tool_calls');
  assert.equal(calls.length, 1);
  checkCall(calls[0].function.name, calls[0].function.arguments);
  // the text the model wrote (its tokens, as logprobs give them) is its own syntax
  const lp = await client.chat.completions.create(
    req({ tool_choice: 'required', parallel_tool_calls: false, logprobs: true }));
  const text = lp.choices[0].logprobs.content.map((t) => t.token).join('');
  assert.match(text, /^\[\s*get_(time|weather)\(\s*[a-z]+\s*=/, text);
  assert.match(text, /\)\s*\]$/, text);
});

test('tool_choice required: calls of the tools, as many as the model writes', async () => {
  const { calls, finish } = await sameCalls({ tool_choice: 'required' });
  assert.ok(finish === 'tool_calls' || finish === 'length', finish);
  assert.ok(calls.length >= 1);
  // a call cut by max_tokens may lack arguments; every whole one validates
  const whole = finish === 'length' ? calls.slice(0, -1) : calls;
  for (const call of whole) checkCall(call.function.name, call.function.arguments);
});

test('a named function: one call of it', async () => {
  const { calls } = await sameCalls({
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, 'get_weather');
  checkCall('get_weather', calls[0].function.arguments);
});
