from ratekit.bucket import TokenBucket


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_refill_is_capped():
    clock = Clock()
    b = TokenBucket(2, 1.0, clock)
    clock.now = 100.0
    assert [b.allow() for _ in range(3)] == [True, True, False]


def test_consumes_and_refills():
    clock = Clock()
    b = TokenBucket(1, 1.0, clock)
    assert b.allow()
    assert not b.allow()
    clock.now = 1.0
    assert b.allow()
