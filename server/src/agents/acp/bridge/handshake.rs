//! `initialize`, the agent's logins, and the requests that open its
//! sessions (asking once more after an `authenticate` its configuration
//! allows).

use super::*;

/// Sends `initialize`; the answer, typed and as the agent wrote it (its
/// `authMethods` may be of kinds this schema version does not know, such
/// as `env_var`, which are kept whole).
pub(super) async fn initialize(
    cx: &ConnectionTo<Agent>,
    timeout: std::time::Duration,
) -> Result<(InitializeResponse, Value), String> {
    // What Tether answers besides permissions: questions (form and URL
    // elicitations, shown to AHP clients as chat input requests), text
    // files in the session's directories (each write a `FileEdit`) and
    // terminals (confined as the agent is, streamed as `terminal/*`).
    let capabilities: ClientCapabilities = serde_json::from_value(serde_json::json!({
        "elicitation": {"form": {}, "url": {}},
        "fs": {"readTextFile": true, "writeTextFile": true},
        "terminal": true,
    }))
    .unwrap_or_default();
    let request = InitializeRequest::new(ProtocolVersion::V1)
        .client_capabilities(capabilities)
        .client_info(Implementation::new("tether", env!("CARGO_PKG_VERSION")).title("Tether"));
    let untyped = agent_client_protocol::UntypedMessage::new("initialize", &request)
        .map_err(|e| format!("cannot write initialize: {e}"))?;
    let raw = match tokio::time::timeout(timeout, cx.send_request(untyped).block_task()).await {
        Ok(Ok(raw)) => raw,
        Ok(Err(err)) => return Err(format!("it refused initialize: {err}")),
        Err(_) => {
            return Err(format!(
                "it did not answer initialize within {} s",
                timeout.as_secs_f64()
            ));
        }
    };
    let response = serde_json::from_value(raw.clone())
        .map_err(|e| format!("its answer to initialize is not ACP's: {e}"))?;
    Ok((response, raw))
}

/// The login an agent's configuration already provides: the first
/// `env_var` method whose every variable is in the agent's own
/// environment (`env`, the names its configuration sets).
pub(in crate::agents::acp) fn configured_login(
    methods: &[Value],
    env: &[String],
) -> Option<String> {
    methods.iter().find_map(|method| {
        let vars = method["vars"].as_array()?;
        let provided = method["type"] == "env_var"
            && !vars.is_empty()
            && vars.iter().all(|v| {
                v["optional"] == true
                    || v["name"]
                        .as_str()
                        .is_some_and(|n| env.iter().any(|e| e == n))
            });
        provided.then(|| method["id"].as_str().map(str::to_owned))?
    })
}

/// How people can log an agent in, for a refusal: each method's name and
/// what it needs.
pub(super) fn login_choices(methods: &[Value]) -> String {
    let shown: Vec<String> = methods
        .iter()
        .map(|m| {
            let name = m["name"].as_str().or(m["id"].as_str()).unwrap_or("?");
            match m["type"].as_str() {
                Some("env_var") => {
                    let vars: Vec<&str> = m["vars"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v["name"].as_str())
                        .collect();
                    format!(
                        "{name} (set {} in the agent's configuration)",
                        vars.join(", ")
                    )
                }
                Some("terminal") => format!("{name} (an interactive login in a terminal)"),
                _ => format!("{name} (the agent's own login)"),
            }
        })
        .collect();
    if shown.is_empty() {
        "it lists no login methods".to_owned()
    } else {
        format!("it offers: {}", shown.join("; "))
    }
}

/// Whether an agent's error says it needs a login (ACP `auth_required`).
pub(super) fn needs_login(err: &agent_client_protocol::Error) -> bool {
    serde_json::to_value(err.code).ok() == Some(serde_json::json!(-32000))
}

/// Sends a session-opening request (`session/new`, `load`, `resume`); when
/// the agent answers that it needs a login and its configuration provides
/// an `env_var` method, calls `authenticate` with it and asks once more.
/// A refusal names the login methods it offers.
pub(super) async fn open_request<Req>(
    cx: &ConnectionTo<Agent>,
    timeout: std::time::Duration,
    what: &str,
    request: Req,
    logins: &Logins,
) -> Result<Req::Response, String>
where
    Req: agent_client_protocol::JsonRpcRequest + Clone,
{
    let in_time = || {
        format!(
            "it did not answer {what} within {} s",
            timeout.as_secs_f64()
        )
    };
    let first = tokio::time::timeout(timeout, cx.send_request(request.clone()).block_task())
        .await
        .map_err(|_| in_time())?;
    let err = match first {
        Ok(answer) => return Ok(answer),
        Err(err) if needs_login(&err) => err,
        Err(err) => return Err(format!("it refused {what}: {}", said(&err))),
    };
    let choices = login_choices(&logins.methods);
    let Some(method) = configured_login(&logins.methods, &logins.env) else {
        return Err(format!(
            "it needs a login: {}; {choices}",
            said(&err).trim_end_matches('.')
        ));
    };
    let login = AuthenticateRequest::new(method.clone());
    tokio::time::timeout(timeout, cx.send_request(login).block_task())
        .await
        .map_err(|_| {
            format!(
                "it did not answer authenticate within {} s",
                timeout.as_secs_f64()
            )
        })?
        .map_err(|e| format!("it refused the login {method:?}: {}; {choices}", said(&e)))?;
    tokio::time::timeout(timeout, cx.send_request(request).block_task())
        .await
        .map_err(|_| in_time())?
        .map_err(|e| format!("it refused {what} after the login {method:?}: {}", said(&e)))
}

/// What an agent offers to log in with, and the environment variables its
/// configuration gives it.
#[derive(Debug, Clone, Default)]
pub(in crate::agents::acp) struct Logins {
    /// `authMethods`, as the agent wrote them.
    pub methods: Vec<Value>,
    /// The names of the variables its configuration sets.
    pub env: Vec<String>,
}

impl Logins {
    pub(super) fn of(command: &AgentCommand, raw: &Value) -> Self {
        let mut env: Vec<String> = command.env.iter().map(|(k, _)| k.clone()).collect();
        env.extend(
            command
                .file_env()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, _)| k),
        );
        Self {
            methods: raw["authMethods"].as_array().cloned().unwrap_or_default(),
            env,
        }
    }
}

pub(super) fn capabilities_of(response: &InitializeResponse) -> AcpCapabilities {
    let caps = &response.agent_capabilities;
    AcpCapabilities {
        load_session: caps.load_session,
        resume: caps.session_capabilities.resume.is_some(),
        additional_directories: caps.session_capabilities.additional_directories.is_some(),
        image: caps.prompt_capabilities.image,
        audio: caps.prompt_capabilities.audio,
        embedded_context: caps.prompt_capabilities.embedded_context,
        mcp_http: caps.mcp_capabilities.http,
        title: response
            .agent_info
            .as_ref()
            .map(|i| i.title.clone().unwrap_or_else(|| i.name.clone())),
        close: caps.session_capabilities.close.is_some(),
        fork: caps.session_capabilities.fork.is_some(),
        auth_methods: response
            .auth_methods
            .iter()
            .filter_map(|m| serde_json::to_value(m).ok())
            .collect(),
        ..AcpCapabilities::default()
    }
}
