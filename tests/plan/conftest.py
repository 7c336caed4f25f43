"""The plan tests build the tiny pipelines once per module, as the infer tests do (their fixtures, shared)."""

from tests.infer.conftest import _module_cache, model_cache  # noqa: F401
