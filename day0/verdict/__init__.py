"""The verdict: release gates (gates), the statistics of paired gates (statistics), what the
validate flow decides between stages (pipeline) and the report model, report.json (report)."""
