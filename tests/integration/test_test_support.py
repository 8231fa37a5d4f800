"""The shared test support itself: a real JetStream server and the scripted upstream."""

import nats
import openai


async def test_nats_server_has_jetstream(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="PROBE", subjects=["probe.>"])
        ack = await js.publish("probe.one", b"x", headers={"Nats-Msg-Id": "m1"})
        again = await js.publish("probe.one", b"x", headers={"Nats-Msg-Id": "m1"})
        # persisted and de-duplicated, as the engram stream relies on
        assert (ack.stream, ack.seq, again.duplicate) == ("PROBE", 1, True)
        assert (await js.stream_info("PROBE")).state.messages == 1
    finally:
        await nc.close()


async def test_scripted_upstream_replies_in_order_and_records(scripted_upstream) -> None:
    scripted_upstream.replies = ["first", "second"]
    client = openai.AsyncOpenAI(base_url=scripted_upstream.base_url, api_key="k")
    one = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "a"}]
    )
    two = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "b"}], stream=True
    )
    streamed = "".join([c.choices[0].delta.content or "" async for c in two])
    three = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "c"}]
    )
    await client.close()
    assert one.choices[0].message.content == "first"
    assert streamed == "second"
    assert three.choices[0].message.content == "second"
    assert [r["messages"][0]["content"] for r in scripted_upstream.chat_requests()] == [
        "a",
        "b",
        "c",
    ]
