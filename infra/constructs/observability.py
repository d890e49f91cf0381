"""What an operator watches: one CloudWatch dashboard, and alarms on what needs a person, with a topic.

The product metrics are the ones the handlers emit through `runner_pool.observability.metrics`
(namespace `RunnerPool`, dimension `service`); the pool's size per class is each pool queue's
visible messages, one message per idle instance, so it needs no code of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.constructs.keys import stack_key
from runner_pool.domain.config import StackConfig
from runner_pool.observability import METRICS_NAMESPACE, SERVICE

PERIOD = Duration.minutes(5)
AT_LEAST = cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
PRODUCT_METRICS: Mapping[str, tuple[tuple[str, str], ...]] = MappingProxyType(
    {
        "Provision: where runners came from": (
            ("warm hits", "WarmHits"),
            ("cold starts", "ColdStarts"),
            ("pool exhausted", "PoolExhausted"),
            ("claim races lost", "ClaimRacesLost"),
            ("shortfall", "ProvisionShortfall"),
        ),
        "Release: where instances went": (
            ("pooled", "ReleasesPooled"),
            ("expired (no receipt)", "ReleasesExpired"),
            ("salvaged", "ReleasesSalvaged"),
            ("retired (reuse limits)", "ReleasesRetired"),
            ("quarantined (foreign job)", "RunnersQuarantined"),
        ),
        "Refresh: what it cleaned up": (
            ("orphans terminated", "OrphansTerminated"),
            ("unreadable records terminated", "UnreadableRecords"),
            ("instances vanished", "InstancesVanished"),
            ("offline runners deleted", "RunnersDeleted"),
            ("webhooks redelivered", "WebhooksRedelivered"),
            ("jobs failed", "RefreshJobsFailed"),
            ("jobs deferred (time)", "RefreshJobsDeferred"),
        ),
        "GitHub: the hourly limit and refusals": (
            ("refresh reads spared for registrations", "GitHubHourShortJobs"),
            ("launches capped by the hour", "LaunchesCappedByGitHubHour"),
            ("runs refused, not reconciled", "RunsUnservedRefused"),
            ("jobs unserved, refused", "JobsUnservedRefused"),
        ),
        "Spot: interruptions, re-runs and the circuit breaker": (
            ("spot interruption warnings", "SpotInterruptions"),
            ("breaker opened", "SpotBreakerOpened"),
            ("provisions served on-demand", "SpotServedOnDemand"),
            ("runs re-run after an interruption", "InterruptedRunsRerun"),
            ("re-runs GitHub refused", "InterruptedRerunsRefused"),
            ("re-runs not asked (release failed)", "InterruptedRerunsFailed"),
        ),
        "Capacity: jobs EC2 could not launch for": (
            ("jobs waiting for capacity", "JobsWaitingForCapacity"),
            ("waits ended, jobs served", "CapacityWaitsEnded"),
        ),
        "Demand: webhooks and dispatch": (
            ("demand queued", "DemandQueued"),
            ("deliveries refused", "DeliveriesRefused"),
            ("labels not served", "UnservedLabels"),
            ("deliveries failed", "DeliveriesFailed"),
            ("provisions started", "ProvisionsStarted"),
            ("runners requested", "RunnersRequested"),
            ("releases started", "ReleasesStarted"),
            ("dispatch failures", "DispatchFailures"),
        ),
    }
)
"""Dashboard widget → (label, metric name) of the counts the handlers emit; a test holds each name against
the handlers' code, so a renamed metric cannot leave an empty graph behind."""
PER_KEY_METRICS: Mapping[str, str] = MappingProxyType(
    {
        "Fleet errors by EC2 error code": "FleetErrors.",
        "Pool launches per class": "PoolLaunched.",
        "Registrations taken from each GitHub App's budget": "RegistrationsTaken.",
        "Registrations made through each GitHub App": "RegistrationsMade.",
        "GitHub Apps skipped (GitHub refused the App a token)": "GitHubAppsSkipped.",
    }
)
"""Widget → prefix of metrics emitted once per key (`FleetErrors.<code>`); the dashboard searches for them."""
PER_KEY_LOWEST: Mapping[str, str] = MappingProxyType(
    {"Registrations each GitHub App's budget had left (lowest)": "RegistrationBudgetLeft."}
)
"""As PER_KEY_METRICS, for a level read at each use: its lowest in the period, not a sum."""


class Observability(Construct):
    """`topic` is the alarms' SNS topic (None when the config names none); `alarms` every alarm by name."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StackConfig,
        state_machines: Mapping[str, sfn.IStateMachine],
        pool_queues: Mapping[str, sqs.IQueue],
        dead_letter_queues: Mapping[str, sqs.IQueue] | None = None,
        scheduled_functions: Mapping[str, lambda_.IFunction] | None = None,
        functions: Sequence[lambda_.IFunction] = (),
        api_name: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.topic = self._topic(config)
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        for name, queue in (dead_letter_queues or {}).items():
            self._alarm(
                f"{name}DeadLetters",
                queue.metric_approximate_number_of_messages_visible(period=PERIOD, statistic="Maximum"),
                f"{name}: messages gave up after their retries and wait in the dead-letter queue",
            )
        for name, machine in state_machines.items():
            shown = name.replace("_", "-")
            self._alarm(
                f"{''.join(part.capitalize() for part in name.split('_'))}Failures",
                cloudwatch.MathExpression(
                    expression="failed + timedOut + aborted",
                    using_metrics={
                        "failed": machine.metric_failed(period=PERIOD),
                        "timedOut": machine.metric_timed_out(period=PERIOD),
                        "aborted": machine.metric_aborted(period=PERIOD),
                    },
                    label=f"{shown} executions that did not succeed",
                    period=PERIOD,
                ),
                f"{shown} executions failed, timed out or were aborted: check the execution's error",
            )
        # GitHub gave one of our runners a job of another run or repository: a person looks.
        self._alarm(
            "RunnersQuarantined",
            _product_metric("RunnersQuarantined", "quarantined"),
            "an instance was quarantined: GitHub gave its runner a job of another run or repository; "
            "the release's log names both run keys",
        )
        # An instance record that does not parse: a bug, or someone who wrote the table.
        self._alarm(
            "UnreadableRecords",
            _product_metric("UnreadableRecords", "unreadable"),
            "an instance record did not parse: refresh terminated its instance as untracked; its log names "
            "the instance and what is wrong with the record, which stays in the table until its TTL",
        )
        # GitHub's hourly remainder fell below refresh's floor (domain/registration_budget.py): registrations
        # have the rest, and at this pace will run out before the hour resets.
        self._alarm(
            "GitHubHourlyBudget",
            _product_metric("GitHubHourShortJobs", "refresh reads spared"),
            "GitHub's hourly API limit is three quarters spent: refresh stopped reading GitHub and Create "
            "launches only what the rest can register; the GitHubHourlyRemaining metric shows the pace",
        )
        # EC2 is taking back a class's spot instances in a wave (domain/spot_breaker.py): its jobs pay
        # on-demand for the cool-down, and a person may want other types or zones for it.
        self._alarm(
            "SpotBreakerOpened",
            _product_metric("SpotBreakerOpened", "breaker opened"),
            "a class's spot interruptions passed fleet.spot_breaker's threshold: its spot demand is served "
            "on-demand for the cool-down; the interruptions function's log names the class",
        )
        # GitHub refused to re-run a run whose job an interruption failed (most often: the installation has
        # not accepted `actions: write`): the job stays failed until a person re-runs it.
        self._alarm(
            "InterruptedRerunsRefused",
            _product_metric("InterruptedRerunsRefused", "re-runs refused"),
            "GitHub refused to re-run the failed jobs of a run an interruption failed (domain/reruns.py): "
            "the job stays failed until a person re-runs it; the dispatcher's log names the run and GitHub's "
            "answer (check that the installation accepted actions: write)",
        )
        # A provision EC2 left short after the on-demand fallback: its jobs wait and are tried again
        # with a back-off (domain/capacity_waits.py); a person may want other types, zones or a quota.
        self._alarm(
            "JobsWaitingForCapacity",
            _product_metric("JobsWaitingForCapacity", "jobs waiting for capacity"),
            "EC2 had no capacity for a provision after the on-demand fallback: its jobs wait and are tried "
            "again with a back-off; runner-pool status lists them with EC2's error",
        )
        self._budget_alarm(config)
        for name, function in (scheduled_functions or {}).items():
            # A scheduled run that fails once is retried by the next; three in a row need a person.
            self._alarm(
                f"{name.capitalize()}Errors",
                function.metric_errors(period=Duration.minutes(1), statistic="Sum"),
                f"{name} failed in 3 consecutive minutes: see its log group",
                evaluation_periods=3,
            )
        self.dashboard = cloudwatch.Dashboard(
            self,
            "Dashboard",
            dashboard_name=f"{Stack.of(self).stack_name}-runner-pool",
            default_interval=Duration.hours(3),
        )
        warm, cold = _product_metric("WarmHits", "warm"), _product_metric("ColdStarts", "cold")
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Warm-hit ratio (%)",
                left=[
                    cloudwatch.MathExpression(
                        expression="100 * warm / (warm + cold)",
                        using_metrics={"warm": warm, "cold": cold},
                        label="runners from the warm pool",
                        period=PERIOD,
                    )
                ],
                left_y_axis=cloudwatch.YAxisProps(min=0, max=100),
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Provision to runners ready (s): the control plane's share of queue time",
                left=[
                    cloudwatch.Metric(
                        namespace=METRICS_NAMESPACE,
                        metric_name="ProvisionToReadySeconds",
                        dimensions_map={"service": SERVICE},
                        statistic=statistic,
                        period=PERIOD,
                        label=statistic,
                    )
                    for statistic in ("p50", "p95")
                ],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Pool size per partition (idle instances)",
                left=[
                    queue.metric_approximate_number_of_messages_visible(
                        period=Duration.minutes(1), statistic="Maximum", label=name
                    )
                    for name, queue in pool_queues.items()
                ],
                width=12,
            ),
        )
        self.dashboard.add_widgets(
            *(
                cloudwatch.GraphWidget(
                    title=title,
                    left=[_product_metric(name, label) for label, name in metrics],
                    width=12,
                )
                for title, metrics in PRODUCT_METRICS.items()
            )
        )
        self.dashboard.add_widgets(
            *(
                cloudwatch.GraphWidget(
                    title=title,
                    left=[
                        cloudwatch.MathExpression(
                            expression=_search(prefix.rstrip("."), statistic), label="", period=PERIOD
                        )
                    ],
                    width=12,
                )
                for title, prefix, statistic in [
                    *((title, prefix, "Sum") for title, prefix in PER_KEY_METRICS.items()),
                    *((title, prefix, "Minimum") for title, prefix in PER_KEY_LOWEST.items()),
                ]
            )
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Executions",
                left=[
                    metric
                    for name, machine in state_machines.items()
                    for metric in (
                        machine.metric_started(period=PERIOD, label=f"{name} started"),
                        machine.metric_succeeded(period=PERIOD, label=f"{name} succeeded"),
                        machine.metric_failed(period=PERIOD, label=f"{name} failed"),
                    )
                ],
                width=12,
            ),
        )
        if functions:
            self.dashboard.add_widgets(
                cloudwatch.GraphWidget(
                    title="Lambda errors",
                    left=[fn.metric_errors(period=PERIOD) for fn in functions],
                    legend_position=cloudwatch.LegendPosition.RIGHT,
                    width=12,
                ),
                cloudwatch.GraphWidget(
                    title="Lambda throttles",
                    left=[fn.metric_throttles(period=PERIOD) for fn in functions],
                    legend_position=cloudwatch.LegendPosition.RIGHT,
                    width=12,
                ),
            )
        if api_name is not None:
            self.dashboard.add_widgets(
                cloudwatch.GraphWidget(
                    title="Webhooks (API Gateway)",
                    left=[
                        _api_metric(api_name, "Count", "received"),
                        _api_metric(api_name, "4XXError", "refused (4xx)"),
                        _api_metric(api_name, "5XXError", "failed (5xx)"),
                    ],
                    width=12,
                ),
            )
        self.dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms.values()), width=24)
        )

    def _budget_alarm(self, config: StackConfig) -> None:
        """Today's spend (refresh's `DailySpendUsd`, domain/budget.py) above `budget.daily_usd`: its highest
        reading in a period, as refresh emits it once a run."""
        if config.budget.daily_usd is None:
            return
        self._alarm(
            "DailyBudgetExceeded",
            cloudwatch.Metric(
                namespace=METRICS_NAMESPACE,
                metric_name="DailySpendUsd",
                dimensions_map={"service": SERVICE},
                statistic="Maximum",
                period=PERIOD,
                label="today's spend (USD, list prices)",
            ),
            f"today's spend at list prices passed budget.daily_usd (${config.budget.daily_usd:g}); "
            + (
                "warm minimums are 0 until midnight UTC; "
                if config.budget.drop_warm_minimums
                else "nothing is held back; "
            )
            + "runner-pool cost --since 1d --by repository shows where it went",
            threshold=config.budget.daily_usd,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
        )

    def _alarm(
        self,
        name: str,
        metric: cloudwatch.IMetric,
        description: str,
        evaluation_periods: int = 1,
        *,
        threshold: float = 1,
        comparison: cloudwatch.ComparisonOperator = AT_LEAST,
    ) -> None:
        alarm = cloudwatch.Alarm(
            self,
            name,
            metric=metric,
            threshold=threshold,
            comparison_operator=comparison,
            evaluation_periods=evaluation_periods,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"runner-pool: {description}",
        )
        if self.topic is not None:
            alarm.add_alarm_action(actions.SnsAction(self.topic))
            alarm.add_ok_action(actions.SnsAction(self.topic))
        self.alarms[name] = alarm

    def _topic(self, config: StackConfig) -> sns.ITopic | None:
        if config.alarms.topic_arn:
            return sns.Topic.from_topic_arn(self, "AlarmTopic", config.alarms.topic_arn)
        if not config.alarms.email:
            return None
        # CloudWatch cannot publish to a topic under the AWS-managed aws/sns key; this key lets it.
        key = stack_key(
            self,
            "AlarmTopicKey",
            "runner-pool: encrypts the alarm topic; CloudWatch alarms may use it to publish",
        )
        key.grant(iam.ServicePrincipal("cloudwatch.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey*")
        topic = sns.Topic(
            self, "AlarmTopic", display_name="runner-pool alarms", master_key=key, enforce_ssl=True
        )
        topic.add_subscription(subscriptions.EmailSubscription(config.alarms.email))
        return topic


def _product_metric(name: str, label: str) -> cloudwatch.Metric:
    return cloudwatch.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map={"service": SERVICE},
        statistic="Sum",
        period=PERIOD,
        label=label,
    )


def _search(terms: str, statistic: str = "Sum") -> str:
    """A metric math SEARCH over the product metrics (namespace and Powertools' `service` dimension);
    an unquoted term matches a whole token of a name, so `FleetErrors` finds `FleetErrors.<code>`."""
    return f"SEARCH('{{{METRICS_NAMESPACE},service}} {terms}', '{statistic}', {PERIOD.to_seconds()})"


def _api_metric(api_name: str, name: str, label: str) -> cloudwatch.Metric:
    return cloudwatch.Metric(
        namespace="AWS/ApiGateway",
        metric_name=name,
        dimensions_map={"ApiName": api_name},
        statistic="Sum",
        period=PERIOD,
        label=label,
    )
