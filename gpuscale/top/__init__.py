"""``gpuscale top``'s parts, a consumer like adapter/ and controller/ (cli/top.py holds the flags and the wiring):

- ``collect``: the ``Collector`` protocol and ``SourcesCollector`` (per-GPU series → the asked view);
  ``custom_metrics``: ``AdapterCollector`` (a running adapter's custom metrics API);
- ``selection``: ``-n/-A/-l`` resolved, and which items fall in it;
- ``document``: the ``GpuTopList`` every collector answers with (the ``-o json|yaml`` document);
- ``sorting``, ``cells``, ``columns``, ``table``, ``render``: ``--sort-by``, cell text, each view's
  columns, the width-fitting layout, and the formatters (table, wide, json, yaml);
- ``screen``: where frames go (stdout, or rich Live with ``--watch``) and the refresh loop.

NB: this package imports nothing here, and its modules import rich, aiohttp and kubernetes_asyncio only in
the functions that use them: ``gpuscale`` builds every subcommand's flags at start.
"""
