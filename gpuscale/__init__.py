"""gpuscale: GPU and inference metrics that tell the truth, served to the HorizontalPodAutoscaler.

Data flows one way (docs/architecture.md; checked by tests/test_layers.py):

    sources/ (all I/O)  →  metrics/, hpa/ (the pure core)  →  adapter/, top/, controller/, report/, replay/
    (sim/ is the simulated cluster of the tests and the demo; cli/ wires the parts together.)
"""

__version__ = "0.1.0"
