//! The usage ledger, for both backends: what each usage report of an agent
//! added to its session's totals, written in the transaction that appends
//! the report, and the sums `GET /v1/usage` answers.

/// What one envelope added to its session's usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    /// The session's project.
    pub project: String,
    /// Its agent (provider).
    pub agent: String,
    /// The model in use (the session's `model` setting), or empty.
    pub model: String,
    /// Who started the turn (the token's `sub`), or empty when not known.
    pub sub: String,
    /// Input tokens added.
    pub input_tokens: i64,
    /// Output tokens added.
    pub output_tokens: i64,
    /// Cost added, in millionths of `currency` (exact sums).
    pub cost_micros: i64,
    /// The cost's currency (ISO 4217 or a unit such as `credits`), or
    /// empty when no cost was reported.
    pub currency: String,
}

/// What a report groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageDimension {
    /// The project.
    Project,
    /// Who started the turns.
    Principal,
    /// The agent.
    Agent,
    /// The model.
    Model,
}

impl UsageDimension {
    /// Every dimension, in report order.
    pub const ALL: [Self; 4] = [Self::Project, Self::Principal, Self::Agent, Self::Model];

    /// Its name in queries (`by=project,principal`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Project => "project",
            Self::Principal => "principal",
            Self::Agent => "agent",
            Self::Model => "model",
        }
    }

    /// Its column in the ledger.
    fn column(self) -> &'static str {
        match self {
            Self::Project => "project",
            Self::Principal => "sub",
            Self::Agent => "agent",
            Self::Model => "model",
        }
    }
}

/// A usage report: the time range, the caller's scope, filters and
/// grouping.
#[derive(Debug, Clone, Default)]
pub struct UsageQuery {
    /// Only what was reported at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Only what was reported before this time.
    pub until_ms: Option<i64>,
    /// Only these projects (the caller's scope); `None`: all.
    pub projects: Option<Vec<String>>,
    /// Only this project.
    pub project: Option<String>,
    /// Only this agent.
    pub agent: Option<String>,
    /// The dimensions to group by, in order (none: one total per
    /// currency).
    pub by: Vec<UsageDimension>,
}

/// One group's totals.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UsageTotal {
    /// The group's value of each dimension of [`UsageQuery::by`], in order.
    pub key: Vec<String>,
    /// The cost's currency (empty: no cost reported).
    pub currency: String,
    /// Input tokens.
    pub input_tokens: i64,
    /// Output tokens.
    pub output_tokens: i64,
    /// Cost in millionths of `currency`.
    pub cost_micros: i64,
    /// Usage reports summed.
    pub reports: i64,
    /// Sessions they came from.
    pub sessions: i64,
}

/// The report's statement, parameters in a fixed order: 1 since, 2 until,
/// 3 the scope list, 4 project, 5 agent (each null when not given).
/// `p(n, kind)` is the backend's n-th parameter with its type (`int`,
/// `text`, `list`), `in_list(p)` its test of `project` against a list.
pub(super) fn usage_sql(
    query: &UsageQuery,
    p: impl Fn(usize, &str) -> String,
    in_list: impl Fn(&str) -> String,
) -> String {
    let dims: Vec<&str> = query.by.iter().map(|d| d.column()).collect();
    let mut select: Vec<String> = dims.iter().map(|c| c.to_string()).collect();
    select.extend(
        [
            "currency",
            // Postgres sums BIGINTs as NUMERIC.
            "CAST(SUM(input_tokens) AS BIGINT)",
            "CAST(SUM(output_tokens) AS BIGINT)",
            "CAST(SUM(cost_micros) AS BIGINT)",
            "COUNT(*)",
            "COUNT(DISTINCT session_id)",
        ]
        .map(str::to_owned),
    );
    let mut group = dims.clone();
    group.push("currency");
    let scope = p(3, "list");
    format!(
        "SELECT {select} FROM usage \
         WHERE ({since} IS NULL OR at_ms >= {since}) \
           AND ({until} IS NULL OR at_ms < {until}) \
           AND ({scope} IS NULL OR {in_list}) \
           AND ({project} IS NULL OR project = {project}) \
           AND ({agent} IS NULL OR agent = {agent}) \
         GROUP BY {group} ORDER BY {group}",
        select = select.join(", "),
        since = p(1, "int"),
        until = p(2, "int"),
        in_list = in_list(&scope),
        project = p(4, "text"),
        agent = p(5, "text"),
        group = group.join(", "),
    )
}

/// A row of [`usage_sql`]'s answer as a total: the dimensions, then the
/// currency and the sums.
pub(super) fn usage_total<R>(row: &R, dims: usize) -> Result<UsageTotal, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let key = (0..dims)
        .map(|i| row.try_get::<String, _>(i))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(UsageTotal {
        key,
        currency: row.try_get(dims)?,
        input_tokens: row.try_get(dims + 1)?,
        output_tokens: row.try_get(dims + 2)?,
        cost_micros: row.try_get(dims + 3)?,
        reports: row.try_get(dims + 4)?,
        sessions: row.try_get(dims + 5)?,
    })
}
