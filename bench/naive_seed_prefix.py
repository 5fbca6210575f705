"""The naive seed algorithm of a prefix-cache replay: the baseline `bench_prefix_curve.py` measures against.

Stdlib json, a tuple hash per block chained on its parent, an OrderedDict LRU over block keys; none of
vLLM's rules (no ref counts, no tail-first freeing, no partial blocks, no L - 1 cap). Prints the hit rate.

    python bench/naive_seed_prefix.py TRACE.jsonl BLOCK_SIZE CAPACITY_BLOCKS
"""

import json
import sys
from collections import OrderedDict


def main() -> None:
    path, bs, capacity = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    lru: OrderedDict = OrderedDict()
    queries = hits = 0
    with open(path) as fh:
        for line in fh:
            tokens = json.loads(line)["tokens"]
            n = len(tokens)
            keys, parent = [], None
            for i in range(n // bs):
                parent = hash((parent, tuple(tokens[i * bs:(i + 1) * bs])))
                keys.append(parent)
            hit = 0
            for k in keys[:(n - 1) // bs]:
                if k not in lru:
                    break
                lru.move_to_end(k)
                hit += 1
            for k in keys[hit:]:
                lru[k] = None
                lru.move_to_end(k)
                while len(lru) > capacity:
                    lru.popitem(last=False)
            queries += n
            hits += hit * bs
    print(hits / queries)


if __name__ == "__main__":
    main()
