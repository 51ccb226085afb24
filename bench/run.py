"""Benchmark runner. Benchmarks report ratios against a baseline measured in the same run."""


def main() -> None:
    print("no benchmarks yet")


if __name__ == "__main__":
    main()
