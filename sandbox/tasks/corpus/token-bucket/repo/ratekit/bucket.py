class TokenBucket:
    """A token bucket; clock is a function returning seconds."""

    def __init__(self, capacity, rate, clock):
        self.capacity = capacity
        self.rate = rate
        self.clock = clock
        self.tokens = float(capacity)
        self.last = clock()

    def allow(self, cost=1):
        now = self.clock()
        self.tokens += (now - self.last) * self.rate
        self.last = now
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False
