"""The multi-process cluster harness: ``chaosp2p cluster SCENARIO.toml`` and ``chaosp2p cluster report``.

Public API (see docs/cluster.md): :func:`~chaosp2p.cluster.scenario.load_scenario` /
:func:`~chaosp2p.cluster.scenario.parse_scenario` -> :class:`~chaosp2p.cluster.scenario.Scenario`;
:func:`~chaosp2p.cluster.runner.run_scenario` -> :class:`~chaosp2p.cluster.runner.RunResult`;
:func:`~chaosp2p.cluster.timeline.read_timeline`, :func:`~chaosp2p.cluster.report.summarize`,
:func:`~chaosp2p.cluster.report.write_plots`. Import the submodules; this package imports nothing,
so ``chaosp2p --help`` stays fast.
"""
