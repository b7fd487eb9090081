"""Change Stream Inspector's backend: pulls, the cache, formats and analysis."""

import os

# Arrow's allocator (mimalloc, read once when pyarrow loads: so here, before any import of it)
# keeps the pages it freed for a second before it gives them back. A pull frees one task's
# Arrow results after another, in the driver and in Spark's Python workers, and each held
# 100-150 MB of freed pages. 0 gives them back at once: a 1M-record pull's peak PSS went
# 1,602 -> 1,387 MB (driver 711 -> 556, workers 405 -> 360); replaying its landings took ~5%
# longer. Spark's local workers inherit it; a cluster's executors get it from the session.
ALLOCATOR_ENV = {"MIMALLOC_PURGE_DELAY": "0"}
for _name, _value in ALLOCATOR_ENV.items():
    os.environ.setdefault(_name, _value)
