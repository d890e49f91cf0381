"""The App's webhook deliveries that failed, and asking GitHub to deliver them again."""

from __future__ import annotations

from runner_pool.adapters.github_api import PAGE_SIZE, GitHubApi
from runner_pool.domain.clock import Epoch
from runner_pool.domain.runners import FailedDelivery


def failed_deliveries(api: GitHubApi, since: Epoch) -> list[FailedDelivery]:
    """Webhook events since `since` that GitHub failed to deliver and has not delivered since.

    One entry per event (its latest attempt), oldest first. GitHub lists deliveries newest first,
    a page at a time behind a cursor, and keeps no `since` filter, so pages are read only until
    they reach `since`. Every status is read, not only failures: an event with a successful
    attempt (a redelivery that worked) is not failed any more.
    """

    def collect() -> list[FailedDelivery]:
        rest = api.rest
        succeeded: set[str] = set()
        latest_failure: dict[str, FailedDelivery] = {}
        pages = rest.paginate(rest.apps.list_webhook_deliveries, per_page=PAGE_SIZE, headers=api.headers)
        for item in pages:
            delivered_at = item.delivered_at.timestamp()
            if delivered_at < since:
                break
            if _succeeded(item.status_code):
                succeeded.add(item.guid)
            elif item.guid not in latest_failure:
                latest_failure[item.guid] = FailedDelivery(
                    delivery_id=item.id,
                    guid=item.guid,
                    event=item.event,
                    action=item.action,
                    delivered_at=delivered_at,
                    status_code=item.status_code,
                )
        failed = [d for guid, d in latest_failure.items() if guid not in succeeded]
        return sorted(failed, key=lambda delivery: (delivery.delivered_at, delivery.delivery_id))

    return api.call(collect)


def redeliver(api: GitHubApi, delivery_id: int) -> None:
    """Ask GitHub to deliver a delivery's event again; it answers at once and delivers shortly after."""
    rest = api.rest
    api.call(lambda: rest.apps.redeliver_webhook_delivery(delivery_id, headers=api.headers))


def _succeeded(status_code: int) -> bool:
    return 200 <= status_code < 300
