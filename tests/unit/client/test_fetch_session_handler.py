"""The consumer's half of a KIP-227 fetch session (client/session_fetcher.FetchSessionHandler), pure logic."""

from __future__ import annotations

from gregor.client.session_fetcher import FetchSessionHandler


def spec(offset: int, epoch: int = 3) -> tuple[int, int, int, bytes]:
    return (offset, epoch, 1024, b"")


def test_a_session_names_only_what_changed_and_forgets_what_left() -> None:
    h = FetchSessionHandler()
    wanted = {("t", 0): spec(0), ("t", 1): spec(0)}
    named, forgotten = h.build(wanted)
    assert (h.session_id, h.epoch, named, forgotten) == (0, 0, list(wanted.items()), [])  # full: every partition
    h.applied(wanted, 42)
    assert (h.session_id, h.epoch) == (42, 1)
    nxt = {("t", 0): spec(5), ("u", 0): spec(0)}  # t-0 moved, u-0 new, t-1 left
    named, forgotten = h.build(nxt)
    assert named == [(("t", 0), spec(5)), (("u", 0), spec(0))] and forgotten == [("t", 1)]
    h.applied(nxt, 42)
    assert h.build(nxt) == ([], []) and h.epoch == 2, "nothing changed: an empty incremental request"
    assert h.build({("t", 0): spec(5, epoch=4), ("u", 0): spec(0)})[0] == [(("t", 0), spec(5, epoch=4))], \
        "a new leader epoch is a change"


def test_an_error_or_a_sessionless_answer_starts_over_with_a_full_request() -> None:
    h = FetchSessionHandler()
    wanted = {("t", 0): spec(0)}
    h.applied(wanted, 7)
    h.reset()
    assert h.build(wanted) == (list(wanted.items()), []) and h.session_id == 7, \
        "the full request names the old session id, so the broker replaces it"
    h.applied(wanted, 0)
    assert h.epoch == 0 and h.sent == {}
    h.epoch = 2**31 - 1
    h.applied(wanted, 9)
    assert h.epoch == 1, "the epoch wraps to 1 as the broker's does"
