"""The validate flow's parameters are named once: day0.request.ValidateRequest."""

import inspect

from day0.request import PARAMETERS, ValidateRequest


def test_flow_signature_is_the_request():
    from flows.validate import validate

    signature = inspect.signature(validate.fn)
    assert tuple(signature.parameters) == PARAMETERS
    for name, field in ValidateRequest.model_fields.items():
        default = signature.parameters[name].default
        assert (default is inspect.Parameter.empty) == field.is_required(), name
        if not field.is_required():
            assert default == field.default, name


def test_parameters_carry_only_what_differs_from_the_defaults():
    request = ValidateRequest(source="s3://models/acme/tiny-llama", target="cpu-bf16",
                              revision="v1.0")
    assert request.as_parameters() == {"source": "s3://models/acme/tiny-llama", "target": "cpu-bf16",
                                       "revision": "v1.0"}
