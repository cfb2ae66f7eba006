"""Ranks grouped by site: who reduces with whom, and which rank speaks for each site.

The hierarchical exchange (``--hierarchy sites``) sums a step's payload in three steps, each
one Horovod collective on a process set:

1. every site sums its members' payloads over its local network (allreduce in the site);
2. one leader per site (its lowest rank) sums the site sums across the wide-area network
   (allreduce among the leaders);
3. each leader sends the total back to its site (broadcast in the site).

So a step's wide-area part is a ring of S leaders (2 (S - 1) hops) instead of all N ranks
(2 (N - 1) hops). Pure Python: the exchange builds the process sets from this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Hierarchy:
    """The sites of a run, as rank groups, seen from one rank.

    Attributes:
        sites: the ranks of each site, ascending; sites in the order of their lowest rank.
        names: the site names, in the same order.
        rank: this rank.

    """

    sites: tuple[tuple[int, ...], ...]
    names: tuple[str, ...]
    rank: int

    @classmethod
    def from_site_names(cls, site_of_rank: list[str], rank: int) -> Hierarchy:
        """Group ranks by the site each reported (``site_of_rank[r]`` is rank r's site)."""
        groups: dict[str, list[int]] = {}
        for each_rank, site in enumerate(site_of_rank):
            groups.setdefault(site, []).append(each_rank)
        return cls(tuple(tuple(g) for g in groups.values()), tuple(groups), rank)

    @classmethod
    def grid(cls, sites: int, per_site: int, rank: int = 0) -> Hierarchy:
        """`sites` sites of `per_site` consecutive ranks each (the fleet's `--sites SxM`)."""
        return cls.from_site_names(
            [f"site-{r // per_site + 1}" for r in range(sites * per_site)], rank
        )

    @property
    def own_site(self) -> tuple[int, ...]:
        """The ranks of this rank's site."""
        return next(site for site in self.sites if self.rank in site)

    @property
    def leader(self) -> int:
        """The rank that exchanges this site's sum across the wide-area network."""
        return self.own_site[0]

    @property
    def is_leader(self) -> bool:
        """Whether this rank is its site's leader."""
        return self.rank == self.leader

    @property
    def leaders(self) -> tuple[int, ...]:
        """Every site's leader, ascending."""
        return tuple(site[0] for site in self.sites)

    @property
    def collectives_per_round(self) -> int:
        """Collectives a site leader runs per summed payload round.

        A sum in its site and the broadcast back if it has company, one sum among the leaders
        if there are several sites.
        """
        in_site = 2 if len(self.own_site) > 1 else 0
        wide_area = 1 if len(self.sites) > 1 else 0
        return max(1, in_site + wide_area)

    def leader_tx_bytes(self, payload_bytes: float) -> float:
        """Bytes a leader sends per summed payload of ``payload_bytes``, by Gloo's algorithms.

        Ring allreduce in the site (2 (m - 1) / m), ring allreduce among the S leaders
        (2 (S - 1) / S, the only wide-area part), binomial-tree broadcast from the leader
        (ceil(log2 m) copies): the busiest device of the hierarchy.
        """
        members, leaders = len(self.own_site), len(self.sites)
        site_sum = 2.0 * (members - 1) / members if members > 1 else 0.0
        wide_area = 2.0 * (leaders - 1) / leaders if leaders > 1 else 0.0
        broadcast = math.ceil(math.log2(members)) if members > 1 else 0
        return (site_sum + wide_area + broadcast) * payload_bytes

    def mean_tx_bytes(self, payload_bytes: float) -> float:
        """Bytes the run's average device sends per summed payload of ``payload_bytes``.

        What an interface counter averaged over all devices measures: every member of a site
        of m sends 2 (m - 1) / m in the site's ring, the S leaders 2 (S - 1) / S each among
        themselves, and a site's broadcast tree sends m - 1 copies in all (each member receives
        one).
        """
        leaders = len(self.sites)
        total = 2.0 * (leaders - 1) if leaders > 1 else 0.0
        for site in self.sites:
            members = len(site)
            total += 2.0 * (members - 1) + (members - 1)
        return total / sum(len(site) for site in self.sites) * payload_bytes
