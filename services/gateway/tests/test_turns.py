"""Turn identity: what a turn is, not which request carried it; and whether a turn can
still be published while the NATS client finds its way back."""

from __future__ import annotations

from typing import Any, cast

from faststream.nats import NatsBroker

from engram_gateway.turns import TurnPublisher, TurnScope, turn_id


def _chat_scope(**change: Any) -> TurnScope:
    values: dict[str, Any] = {
        "tenant": "default",
        "user_id": "u",
        "conversation_id": "c",
        "request_id": "req-1",
        "model": "m",
        "turn_index": 4,
        "prompt": "Where do I like to hike?",
        **change,
    }
    return TurnScope.chat(**values)


def test_a_turn_is_identified_by_what_it_is_not_by_the_request() -> None:
    scope = _chat_scope()
    user = scope.event("user", "Where do I like to hike?")
    # a retried request (new request id, same history position and text): the same turn
    retried = _chat_scope(request_id="req-2").event("user", "Where do I like to hike?")
    assert retried.turn_id == user.turn_id and retried.event_id == user.event_id
    assert user.turn_id == turn_id("default", "u", "c", scope.key, "user")
    # another user, conversation, tenant, position or text: another turn
    for change in (
        {"user_id": "v"},
        {"conversation_id": "d"},
        {"tenant": "other"},
        {"turn_index": 6},
        {"prompt": "Where do I like to swim?"},
    ):
        assert _chat_scope(**change).event("user", "x").turn_id != user.turn_id, change
    # the reply to that turn has one identity; a regenerated reply is a new event for it
    reply, regenerated = scope.event("assistant", "The Alps."), scope.event("assistant", "Alps!")
    assert reply.turn_id == regenerated.turn_id != user.turn_id
    assert reply.event_id != regenerated.event_id
    assert (user.turn_index, reply.turn_index) == (4, 5)


class _Connection:
    def __init__(self, status: str) -> None:
        self.is_connected = status == "CONNECTED"
        self.is_reconnecting = status == "RECONNECTING"
        self.is_connecting = status == "CONNECTING"


class _Broker:
    def __init__(self, status: str) -> None:
        self.connection = _Connection(status)


def _broker(status: str) -> NatsBroker:
    return cast(NatsBroker, _Broker(status))


async def test_a_publisher_whose_client_is_on_its_way_back_waits_for_it() -> None:
    # nats-py, reconnecting after a node died: RECONNECTING while it looks for a server,
    # CONNECTING while it shakes hands with one, back to RECONNECTING if that one fails
    for status in ("CONNECTED", "RECONNECTING", "CONNECTING"):
        assert TurnPublisher(_broker(status)).may_reconnect(), status
    closed = TurnPublisher(_broker("CLOSED"), retry_s=5.0)
    assert not closed.may_reconnect()
    assert not await closed.wait_connected()  # at once: nothing is coming back
