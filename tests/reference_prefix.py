"""A naive, obviously-correct reference of the vLLM rules, for property tests of the fast engine.

Block keys are the whole prefix (salt and every token so far) as a tuple: exact equality, no hashing.
The free queue is a plain list; every operation is the literal reading of the rules.
"""

from __future__ import annotations


class NaiveVllm:
    def __init__(self, capacity: int, block_size: int):
        self.bs = block_size
        self.ref = [0] * capacity
        self.key = [None] * capacity
        self.free = list(range(capacity))   # index 0 is the front (evicted first)
        self.map: dict = {}                 # prefix -> [block ids], oldest first
        self.evicted = 0
        self.victims: list = []             # keys no block holds any more, in eviction order (offload tier)

    def run(self, tokens, salt=None) -> int:
        bs, n = self.bs, len(tokens)
        keys = [(salt, tuple(tokens[:(i + 1) * bs])) for i in range(n // bs)]
        hits = []
        for i in range(min(len(keys), (n - 1) // bs)):
            if self.map.get(keys[i]):
                hits.append(self.map[keys[i]][0])
            else:
                break
        for b in hits:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        need = -(-n // bs) - len(hits)
        assert need <= len(self.free), "capacity too small for the reference"
        blocks = list(hits)
        for _ in range(need):
            b = self.free.pop(0)
            if self.key[b] is not None:
                self.map[self.key[b]].remove(b)
                if not self.map[self.key[b]]:
                    del self.map[self.key[b]]
                    self.victims.append(self.key[b])
                self.key[b] = None
                self.evicted += 1
            self.ref[b] = 1
            blocks.append(b)
        for i in range(len(hits), len(keys)):
            self.key[blocks[i]] = keys[i]
            self.map.setdefault(keys[i], []).append(blocks[i])
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.key[b] is not None:
                    self.free.append(b)
                else:
                    self.free.insert(0, b)
        return len(hits) * bs
