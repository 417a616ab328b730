"""Rendering: report.md and the terminal table (report), writing and publishing a report with
its plots and files (publish), plot and markdown table helpers for the stages (plots, tables)
and how a run is labelled in the orchestrator (labels)."""
