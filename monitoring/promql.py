"""A small client for Prometheus's HTTP query API (instant and range queries)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

QUERY_TIMEOUT_SECONDS = 30.0


class PrometheusQueryError(RuntimeError):
    """Prometheus could not be reached or rejected a query; the message has the query."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant query: its labels and value."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    """One series of a range query: its labels, Unix times in seconds and values."""

    labels: dict[str, str]
    times_seconds: list[float]
    values: list[float]


def _parse_value(text: str) -> float:
    return float(text)  # Prometheus writes NaN, +Inf and -Inf the way float() reads them


class PrometheusApi:
    """Queries one Prometheus server, e.g. PrometheusApi("http://127.0.0.1:19090")."""

    def __init__(self, url: str, timeout_seconds: float = QUERY_TIMEOUT_SECONDS) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"Prometheus URL {url!r} must look like http://HOST:PORT")
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds

    def _get(self, path: str, params: dict[str, str]) -> Any:
        address = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(address, timeout=self.timeout_seconds) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            detail = error.read().decode("utf-8", "replace")[:500]
            raise PrometheusQueryError(
                f"Prometheus at {self.url} rejected {params.get('query', path)!r}: {detail}"
            ) from error
        except (urllib.error.URLError, OSError) as error:
            raise PrometheusQueryError(f"cannot reach Prometheus at {self.url}: {error}") from error
        if body.get("status") != "success":
            raise PrometheusQueryError(f"Prometheus at {self.url} answered {body} for {params}")
        return body["data"]

    def query(self, expr: str, time_seconds: float | None = None) -> list[Sample]:
        """Evaluate `expr` at `time_seconds` (default: now); a scalar comes back as one sample."""
        params = {"query": expr}
        if time_seconds is not None:
            params["time"] = f"{time_seconds:.3f}"
        data = self._get("/api/v1/query", params)
        if data["resultType"] == "vector":
            return [
                Sample(item["metric"], _parse_value(item["value"][1])) for item in data["result"]
            ]
        if data["resultType"] == "scalar":
            return [Sample({}, _parse_value(data["result"][1]))]
        raise PrometheusQueryError(f"query {expr!r} returned a {data['resultType']}, not a vector")

    def query_range(
        self, expr: str, start_seconds: float, end_seconds: float, step_seconds: float
    ) -> list[Series]:
        """Evaluate `expr` every `step_seconds` from `start_seconds` to `end_seconds`."""
        if not step_seconds > 0 or not end_seconds >= start_seconds:
            raise ValueError(
                f"range {start_seconds}..{end_seconds} step {step_seconds}: "
                "need end >= start and step > 0"
            )
        params = {
            "query": expr,
            "start": f"{start_seconds:.3f}",
            "end": f"{end_seconds:.3f}",
            "step": f"{step_seconds:.3f}",
        }
        data = self._get("/api/v1/query_range", params)
        return [
            Series(
                item["metric"],
                [float(time) for time, _ in item["values"]],
                [_parse_value(value) for _, value in item["values"]],
            )
            for item in data["result"]
        ]

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets, as Prometheus's /api/v1/targets lists them."""
        return list(self._get("/api/v1/targets", {"state": "active"})["activeTargets"])
