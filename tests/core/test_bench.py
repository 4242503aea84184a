"""`python -m paged.bench` prints the line the issue names, one per size."""
import re

from paged.bench import main


def test_bench_prints_one_line_per_size(capsys):
    main(["--sizes", "4", "16", "--steps", "40"])
    lines = capsys.readouterr().out.splitlines()
    assert [re.fullmatch(r"running=(\d+) us_per_step=[\d.]+ us_per_request=[\d.]+", x).group(1) for x in lines] \
        == ["4", "16"]
    main(["--sizes", "8", "--steps", "40", "--real-tokens"])
    assert re.fullmatch(r"running=8 us_per_step=[\d.]+ us_per_request=[\d.]+ sampled_tokens=real",
                        capsys.readouterr().out.strip())
