"""Pure, in-memory metric processing: exposition parsing, catalogue, attribution, aggregation, store."""
