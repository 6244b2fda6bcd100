"""The speed settings: resolved per device, overrides winning, a bad value named."""

import pytest

from dragon_dagster.engine.config.hardware import SettingsError, Speed, build


def test_speed_settings_resolve_per_device_and_name_bad_values():
    assert Speed().resolve("cuda") == Speed(
        packing="on", loss_kernel="trl", unpad="off", dropout_mask="torch", lora_product="peft", sampling="grouped"
    )
    assert Speed().resolve("cpu") == Speed(
        packing="off",
        loss_kernel="chunked",
        unpad="on",
        dropout_mask="fast",
        lora_product="accumulated",
        sampling="grouped",
    )
    assert Speed(packing="off", loss_kernel="chunked").resolve("cuda").packing == "off"  # overrides win
    with pytest.raises(SettingsError, match="speed.packing"):
        build(Speed, {"packing": "yes"}, "speed")
    with pytest.raises(SettingsError, match="speed.unpad"):
        build(Speed, {"unpad": True}, "speed")
    with pytest.raises(SettingsError, match="speed.dropout_mask"):
        build(Speed, {"dropout_mask": "quick"}, "speed")
    with pytest.raises(SettingsError, match="speed.generation_batch_size"):
        build(Speed, {"generation_batch_size": 0}, "speed")
    with pytest.raises(SettingsError, match="unknown setting"):
        build(Speed, {"pack": "on"}, "speed")
