//! `GET /v1/agents`: the agents sessions can run, with what each ACP agent
//! reported at `initialize`.

use axum::Json;
use axum::extract::State;
use tether_protocol::rest::{AgentEntry, AgentList};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::agents::AgentKind;
use crate::auth::Principal;

/// The routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_agents))
}

/// The agents this host offers: the built-in `echo` and each configured
/// ACP agent (`--agent NAME=COMMAND`).
#[utoipa::path(
    get,
    path = "/v1/agents",
    tag = "agents",
    responses((status = 200, description = "The agents.", body = AgentList))
)]
pub async fn list_agents(State(state): State<AppState>, _caller: Principal) -> Json<AgentList> {
    let agents = state
        .engine
        .agents()
        .list()
        .iter()
        .map(|spec| {
            // Names, titles and capabilities only: never the command line,
            // its arguments or its environment (the operator's, and often
            // keys).
            let (kind, capabilities) = match &spec.kind {
                AgentKind::Builtin => ("builtin", None),
                AgentKind::Acp(_, capabilities) => {
                    ("acp", capabilities.as_ref().map(|c| c.to_json()))
                }
            };
            AgentEntry {
                provider: spec.provider.clone(),
                display_name: spec.display_name.clone(),
                description: spec.description.clone(),
                kind: kind.to_owned(),
                capabilities,
            }
        })
        .collect();
    Json(AgentList { agents })
}
