"""Reference pages of the day0 site, generated from the code when `mkdocs build` runs (docs/hooks.py).

They read whatever the installed packages hold at build time (the argparse parser, the pydantic
models, the stage registry, the module tree), so they cannot drift from the code; nothing here
names a module path, an option or a field.
"""
