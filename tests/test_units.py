import pytest

from parosim.errors import InputError
from parosim.units import parse_bandwidth, parse_size, parse_time


@pytest.mark.parametrize("text,expected", [
    ("100Gbps", 12.5e9), ("2000Gbps", 250e9), ("300GB/s", 300e9), ("25GBps", 25e9),
    ("400Mbps", 50e6), (1e9, 1e9)])
def test_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("text,expected", [
    ("1GiB", 2**30), ("80GB", 80 * 10**9), ("512KiB", 512 * 1024), ("4096", 4096),
    ("1.5GB", 1_500_000_000), (64, 64), ("1 MiB", 2**20)])
def test_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text,expected", [("5us", 5e-6), ("2ms", 2e-3), ("0s", 0.0),
                                           ("1.5ns", 1.5e-9), (3, 3.0)])
def test_time(text, expected):
    assert parse_time(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("fn,text,needle", [
    (parse_bandwidth, "100Gb", "not a bandwidth"), (parse_bandwidth, "0Gbps", "positive"),
    (parse_bandwidth, "-5GB/s", "not a bandwidth"), (parse_size, "1XB", "not a size"),
    (parse_size, "0GB", "positive"), (parse_time, "5 lightyears", "not a time"),
    (parse_size, True, "not a size")])
def test_bad_units_name_the_value(fn, text, needle):
    with pytest.raises(InputError) as e:
        fn(text)
    assert needle in str(e.value) and repr(text) in str(e.value)
