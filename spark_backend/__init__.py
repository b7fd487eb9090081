"""Change Stream Inspector's backend: pulls, the cache, formats and analysis."""

from spark_backend.model.config import set_allocator_env

set_allocator_env()  # before anything of ours loads pyarrow (``config.ALLOCATOR_ENV``)
