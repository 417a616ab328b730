"""A plugin that does nothing: the target must align with the reference."""


def apply(model) -> None:
    return None
