"""gpuscale: GPU and inference metrics that tell the truth, served to the HorizontalPodAutoscaler.

Data flows one way (see README "Architecture"):

    sources/ (scrape, kube)  →  metrics/ (exposition, catalogue, attribution, store)  →  adapter/, sim/
"""

__version__ = "0.1.0"
