"""The official OpenAI and Anthropic Python SDKs through Sluice (Envoy and
the mock provider of tests/harness/src/llm.rs), for tests/e2e/tests/envoy_sdks.rs.

    python3 clients.py SCENARIO BASE_URL TEAM

prints one JSON object per line, one per call: what the SDK returned or
raised, and how long it took. Scenarios:

- shapes: the nine call shapes, streamed and not, each reading its answer;
- refused: one call of each SDK on a spent budget (the SDK's exception,
  its message, the time it took: the SDK must not wait out a long
  `retry-after`);
- ended: a stream of each API shape that passes its budget (`end_stream`):
  what the SDK raises at the gateway's error event;
- early: a stream of each SDK that the caller closes after 5 events.
"""

import json
import sys
import time

import anthropic
import openai

SCENARIO, BASE, TEAM = sys.argv[1], sys.argv[2], sys.argv[3]
HEADERS = {"x-team": TEAM}
MESSAGES = [{"role": "user", "content": "hello " * 20}]


def clients(output, extra=None):
    headers = dict(HEADERS, **{"x-mock-output": str(output)}, **(extra or {}))
    oai = openai.OpenAI(base_url=BASE + "/v1", api_key="sk-test", default_headers=headers)
    ant = anthropic.Anthropic(base_url=BASE, api_key="sk-ant-test", default_headers=headers)
    return oai, ant


def report(shape, started, **fields):
    fields.update(shape=shape, seconds=round(time.monotonic() - started, 3))
    print(json.dumps(fields), flush=True)


def run(shape, call):
    started = time.monotonic()
    try:
        text = call()
        report(shape, started, ok=True, text=text)
    except Exception as err:  # the test reads what each SDK raised
        body = getattr(err, "body", None)
        report(shape, started, ok=False, error=type(err).__name__, message=str(err),
               status=getattr(err, "status_code", None), body=body if isinstance(body, (dict, list)) else None)


def shapes():
    oai, ant = clients(12)
    run("chat", lambda: oai.chat.completions.create(model="mock", messages=MESSAGES, max_tokens=50)
        .choices[0].message.content)

    def chat_stream():
        stream = oai.chat.completions.create(model="mock", messages=MESSAGES, max_tokens=50, stream=True,
                                             stream_options={"include_usage": True})
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    run("chat_stream", chat_stream)

    def chat_helper():
        with oai.chat.completions.stream(model="mock", messages=MESSAGES, max_tokens=50,
                                         stream_options={"include_usage": True}) as stream:
            for _ in stream:
                pass
            return stream.get_final_completion().choices[0].message.content
    run("chat_helper", chat_helper)
    run("responses", lambda: oai.responses.create(model="mock", input="hello", max_output_tokens=50).output_text)

    def responses_stream():
        stream = oai.responses.create(model="mock", input="hello", max_output_tokens=50, stream=True)
        return "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    run("responses_stream", responses_stream)

    def responses_helper():
        with oai.responses.stream(model="mock", input="hello", max_output_tokens=50) as stream:
            for _ in stream:
                pass
            return stream.get_final_response().output_text
    run("responses_helper", responses_helper)
    run("messages", lambda: ant.messages.create(model="mock", max_tokens=50, messages=MESSAGES).content[0].text)

    def messages_stream():
        stream = ant.messages.create(model="mock", max_tokens=50, messages=MESSAGES, stream=True)
        return "".join(e.delta.text for e in stream if e.type == "content_block_delta")
    run("messages_stream", messages_stream)

    def messages_helper():
        with ant.messages.stream(model="mock", max_tokens=50, messages=MESSAGES) as stream:
            return "".join(stream.text_stream)
    run("messages_helper", messages_helper)


def refused():
    oai, ant = clients(12)
    run("chat", lambda: oai.chat.completions.create(model="mock", messages=MESSAGES, max_tokens=50))
    run("responses", lambda: oai.responses.create(model="mock", input="hello", max_output_tokens=50))
    run("messages", lambda: ant.messages.create(model="mock", max_tokens=50, messages=MESSAGES))


def ended(hold):
    # No cap: the policy's default is reserved, and the stream runs past it.
    oai, ant = clients(100000, {"x-mock-hold": hold})

    def chat():
        stream = oai.chat.completions.create(model="mock", messages=MESSAGES, stream=True,
                                             stream_options={"include_usage": True})
        return sum(1 for c in stream if c.choices and c.choices[0].delta.content)
    run("chat", chat)

    def responses():
        stream = oai.responses.create(model="mock", input="hello " * 20, stream=True)
        return sum(1 for e in stream if e.type == "response.output_text.delta")
    run("responses", responses)

    def messages():
        stream = ant.messages.create(model="mock", max_tokens=100000, messages=MESSAGES, stream=True)
        return sum(1 for e in stream if e.type == "content_block_delta")
    run("messages", messages)


def early():
    # The provider holds after 40 events until the client goes.
    oai, ant = clients(1000, {"x-mock-hold": "40"})

    def chat():
        stream = oai.chat.completions.create(model="mock", messages=MESSAGES, stream=True,
                                             stream_options={"include_usage": True})
        seen = 0
        for chunk in stream:
            seen += bool(chunk.choices and chunk.choices[0].delta.content)
            if seen == 30:
                stream.close()
                break
        return seen
    run("chat", chat)

    def messages():
        with ant.messages.stream(model="mock", max_tokens=1000, messages=MESSAGES) as stream:
            seen = 0
            for _ in stream.text_stream:
                seen += 1
                if seen == 30:
                    break
        return seen
    run("messages", messages)


if SCENARIO == "shapes":
    shapes()
elif SCENARIO == "refused":
    refused()
elif SCENARIO.startswith("ended:"):
    ended(SCENARIO.split(":", 1)[1])
elif SCENARIO == "early":
    early()
else:
    sys.exit("unknown scenario " + SCENARIO)
