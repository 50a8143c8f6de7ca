//! `GET /v1/usage`: what the agents of the caller's projects used and cost
//! over a time range, grouped by project, principal, agent and model; JSON
//! or CSV.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tether_protocol::rest::{Problem, UsageLine, UsageReport};
use tether_protocol::validate_name;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use super::extract::{ApiQuery, timestamp};
use crate::AppState;
use crate::auth::Principal;
use crate::store::rfc3339;
use crate::store::usage::{UsageDimension, UsageQuery, UsageTotal};

/// The routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(usage_report))
}

/// Query of `GET /v1/usage`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Only usage reported at or after this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    since: Option<String>,
    /// Only usage reported before this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    until: Option<String>,
    /// Only this project.
    #[param(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    project: Option<String>,
    /// Only this agent.
    #[param(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    agent: Option<String>,
    /// What to group by: a comma-separated list of `project`, `principal`,
    /// `agent`, `model` (default `project`; empty for one total per
    /// currency).
    #[param(
        max_length = 64,
        pattern = "^((project|principal|agent|model)(,(project|principal|agent|model))*)?$"
    )]
    by: Option<String>,
    /// `json` (the default) or `csv`.
    #[param(value_type = Option<String>, pattern = "^(json|csv)$")]
    format: Option<String>,
}

/// The dimensions `by` names, in order, each once.
fn dimensions(by: Option<&str>) -> Result<Vec<UsageDimension>, ApiError> {
    let Some(by) = by else {
        return Ok(vec![UsageDimension::Project]);
    };
    if by.len() > 64 {
        return Err(ApiError::invalid(
            "by is longer than 64 characters: name each of project, principal, agent, model once.",
        ));
    }
    let mut dims = Vec::new();
    for name in by.split(',').filter(|n| !n.is_empty()) {
        let dim = UsageDimension::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "by lists project, principal, agent or model, separated by commas; \
                     got {name:?}."
                ))
            })?;
        if !dims.contains(&dim) {
            dims.push(dim);
        }
    }
    Ok(dims)
}

/// A total as a report line.
fn line(dims: &[UsageDimension], total: UsageTotal) -> UsageLine {
    let mut line = UsageLine {
        project: None,
        principal: None,
        agent: None,
        model: None,
        currency: total.currency,
        input_tokens: u64::try_from(total.input_tokens).unwrap_or_default(),
        output_tokens: u64::try_from(total.output_tokens).unwrap_or_default(),
        cost: total.cost_micros as f64 / 1e6,
        reports: u64::try_from(total.reports).unwrap_or_default(),
        sessions: u64::try_from(total.sessions).unwrap_or_default(),
    };
    for (dim, value) in dims.iter().zip(total.key) {
        let slot = match dim {
            UsageDimension::Project => &mut line.project,
            UsageDimension::Principal => &mut line.principal,
            UsageDimension::Agent => &mut line.agent,
            UsageDimension::Model => &mut line.model,
        };
        *slot = Some(value);
    }
    line
}

/// One CSV field: quoted when it must be, and never read as a formula by a
/// spreadsheet (a leading `=`, `+`, `-`, `@` gets a `'`).
fn csv_field(text: &str) -> String {
    let text = if text.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{text}")
    } else {
        text.to_owned()
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

/// The report as CSV: a header, then one line per row.
fn csv(report: &UsageReport) -> String {
    let mut out = String::new();
    let mut header: Vec<&str> = report.by.iter().map(String::as_str).collect();
    header.extend([
        "currency",
        "input_tokens",
        "output_tokens",
        "cost",
        "reports",
        "sessions",
    ]);
    out.push_str(&header.join(","));
    out.push_str("\r\n");
    for row in &report.rows {
        let mut fields: Vec<String> = report
            .by
            .iter()
            .map(|d| {
                let value = match d.as_str() {
                    "project" => &row.project,
                    "principal" => &row.principal,
                    "agent" => &row.agent,
                    _ => &row.model,
                };
                csv_field(value.as_deref().unwrap_or_default())
            })
            .collect();
        fields.extend([
            csv_field(&row.currency),
            row.input_tokens.to_string(),
            row.output_tokens.to_string(),
            format!("{:.6}", row.cost),
            row.reports.to_string(),
            row.sessions.to_string(),
        ]);
        out.push_str(&fields.join(","));
        out.push_str("\r\n");
    }
    out
}

/// What the agents of the caller's projects used and cost: tokens and cost
/// (as the agents reported them) summed per group and currency over a time
/// range. Operators and admins; each sees only its projects.
#[utoipa::path(
    get,
    path = "/v1/usage",
    tag = "sessions",
    params(UsageParams),
    responses(
        (status = 200, description = "The totals, as JSON or CSV (`text/csv`).", body = UsageReport,
         content((UsageReport = "application/json"), (String = "text/csv"))),
        (status = 400, description = "Malformed query.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A viewer: usage is for operators and admins.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A parameter breaks a rule (it is named).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn usage_report(
    State(state): State<AppState>,
    caller: Principal,
    ApiQuery(params): ApiQuery<UsageParams>,
) -> Result<Response, ApiError> {
    if !caller.can_write() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "Usage reports are for operators and admins.",
        ));
    }
    for (name, value) in [("project", &params.project), ("agent", &params.agent)] {
        if let Some(value) = value {
            validate_name(name, value)?;
        }
    }
    let csv_wanted = match params.format.as_deref() {
        None | Some("json") => false,
        Some("csv") => true,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "format must be json or csv; got {other:?}."
            )));
        }
    };
    let by = dimensions(params.by.as_deref())?;
    let query = UsageQuery {
        since_ms: timestamp("since", params.since.as_deref())?,
        until_ms: timestamp("until", params.until.as_deref())?,
        projects: caller.project_scope(),
        project: params.project.clone(),
        agent: params.agent.clone(),
        by: by.clone(),
    };
    let totals = state.store.usage(&query).await?;
    let report = UsageReport {
        since: query.since_ms.map(rfc3339),
        until: query.until_ms.map(rfc3339),
        by: by.iter().map(|d| d.name().to_owned()).collect(),
        rows: totals.into_iter().map(|t| line(&by, t)).collect(),
    };
    if !csv_wanted {
        return Ok(axum::Json(report).into_response());
    }
    let mut response = csv(&report).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    response.headers_mut().insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"usage.csv\""),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_quoted_and_never_formulas() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("=HYPERLINK(1)"), "'=HYPERLINK(1)");
        assert_eq!(csv_field("-1+1"), "'-1+1");
    }

    #[test]
    fn by_names_known_dimensions_once() {
        assert_eq!(
            dimensions(Some("agent,project,agent")).unwrap(),
            [UsageDimension::Agent, UsageDimension::Project]
        );
        assert_eq!(dimensions(Some("")).unwrap(), []);
        assert_eq!(dimensions(None).unwrap(), [UsageDimension::Project]);
        assert!(dimensions(Some("cost")).is_err());
    }
}
