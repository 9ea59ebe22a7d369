"""Property-based fuzzing (hypothesis) of the exposition parser, the label selector parser and the API paths.

Every property runs a fixed number of generated cases, named by an ``EXAMPLES_*`` constant next to the test so
the README can quote it. Runs are derandomized: ``derandomize=True`` (the examples are derived from a hash of
the test function's source, not from a random seed) and ``database=None`` (no example database is read or
written), so the same invocation on the same commit runs the same cases every time. NB: hypothesis also mixes in
constants it finds in the loaded local modules, so ``pytest tests/fuzz/x.py`` alone and a whole-suite run may
draw different cases (each reproducibly); a change to a test, to product code or to hypothesis changes them too.
That is why the fuzz dictionaries' known-hostile inputs (``HOSTILE``, ``_HOSTILE_SELECTORS``, ``MALFORMED``) are
also checked by plain parametrized tests, which run every time whatever the generator draws.

- ``test_exposition_fuzz.py``: generated metric families → text → exactly the generated samples
  (prometheus_client's parsers as an independent oracle); real fixtures mutated byte-wise and arbitrary bytes
  → samples or an ``ExpositionError`` naming a real line, never another exception.
- ``test_selector_fuzz.py``: generated selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, exists, ``!``,
  ``>``/``<``) parse to the generated requirements, round-trip through their text and metav1 forms and match
  exactly the label sets a reference evaluator says; arbitrary strings parse or raise ``SelectorError``.
- ``test_api_fuzz.py``: random methods, paths (percent-encoded segments), selectors and query strings against
  the app behind the adapter's own HTTP layer (``AdapterRunner``): only 200/400/403/404/405/406/503, every
  non-200 ``/apis`` answer a metav1.Status with ``code`` = the HTTP status, every served value finite.
- ``test_malformed_http.py``: raw-socket malformed and hypothesis-generated garbage requests against the
  ``gpuscale adapter --insecure-port`` subprocess on the simulated cluster: a 4xx Status (or a close), the next
  good request served, and no ERROR line or traceback in the adapter's log.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

__all__ = ["HealthCheck", "fuzz_settings"]


def fuzz_settings(max_examples: int, *, suppress: tuple[HealthCheck, ...] = ()) -> settings:
    """The settings every fuzz test runs with: ``max_examples`` cases, derandomized, no example database."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(suppress),
        print_blob=False,
    )
