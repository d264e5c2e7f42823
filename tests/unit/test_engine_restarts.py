"""When the server restarts a failed engine: at once, then after a doubling back-off, until too many
restarts in the window (a crash loop) leave none; old restarts leave the window."""

from openai_serve.engine_restarts import MAX_BACKOFF_S, RestartPolicy


def test_first_at_once_then_a_doubling_back_off_up_to_the_limit() -> None:
    policy = RestartPolicy(max_restarts=8, window_s=600)
    assert [policy.next_delay(now=0.0) for _ in range(8)] == [0, 1, 2, 4, 8, 16, MAX_BACKOFF_S, MAX_BACKOFF_S]
    assert policy.next_delay(now=0.0) is None  # a crash loop: the server gives up


def test_restarts_leave_the_window() -> None:
    policy = RestartPolicy(max_restarts=2, window_s=600)
    assert policy.next_delay(now=0.0) == 0 and policy.next_delay(now=10.0) == 1
    assert policy.next_delay(now=20.0) is None
    assert policy.next_delay(now=700.0) == 0  # both older than the window: as good as new


def test_no_restarts_asked_for() -> None:
    assert RestartPolicy(max_restarts=0).next_delay(now=0.0) is None
