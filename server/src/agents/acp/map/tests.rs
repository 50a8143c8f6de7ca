use super::*;
use agent_client_protocol::v1::schema::RequestPermissionRequest;

fn update(value: Value) -> SessionUpdate {
    serde_json::from_value(value).expect("an ACP session update")
}

fn kinds(actions: &Actions) -> Vec<&str> {
    actions
        .iter()
        .map(|(_, a)| a["type"].as_str().unwrap_or_default())
        .collect()
}

fn map() -> TurnMap {
    let mut map = TurnMap::new("ahp-session://s");
    map.begin(
        Turn {
            chat: "ahp-chat://s/main".into(),
            turn_id: "t1".into(),
        },
        1_000,
    );
    map
}

#[test]
fn streamed_text_opens_a_part_then_appends_deltas_and_a_thought_opens_its_own() {
    let mut map = map();
    let chunk = |kind: &str, text: &str| {
        update(json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}}))
    };
    let mut all = map.update("acp-1", &chunk("agent_message_chunk", "Hel"));
    all.extend(map.update("acp-1", &chunk("agent_message_chunk", "lo")));
    all.extend(map.update("acp-1", &chunk("agent_thought_chunk", "hmm")));
    all.extend(map.update("acp-1", &chunk("agent_thought_chunk", "...")));
    all.extend(map.update("acp-1", &chunk("agent_message_chunk", "!")));
    assert_eq!(
        kinds(&all),
        [
            "chat/responsePart",
            "chat/delta",
            "chat/responsePart",
            "chat/reasoning",
            "chat/responsePart"
        ]
    );
    assert_eq!(all[1].1["partId"], all[0].1["part"]["id"]);
    assert_eq!(all[2].1["part"]["kind"], "reasoning");
    assert_ne!(all[4].1["part"]["id"], all[0].1["part"]["id"]);
    assert!(all.iter().all(|(c, _)| c == "ahp-chat://s/main"));
}

#[test]
fn a_tool_call_without_permission_runs_and_completes() {
    let mut map = map();
    let mut all = map.update(
        "acp-1",
        &update(json!({"sessionUpdate": "tool_call", "toolCallId": "c1",
        "title": "Reading", "kind": "read", "status": "pending", "rawInput": {"path": "/a"}})),
    );
    all.extend(map.update("acp-1", &update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "c1",
        "status": "completed", "content": [{"type": "content", "content": {"type": "text", "text": "body"}}]}))));
    assert_eq!(
        kinds(&all),
        [
            "chat/toolCallStart",
            "chat/toolCallDelta",
            "chat/toolCallReady",
            "chat/toolCallComplete"
        ]
    );
    assert_eq!(all[0].1["toolName"], "read");
    assert_eq!(all[2].1["confirmed"], "not-needed");
    assert_eq!(all[3].1["result"]["success"], true);
    assert_eq!(all[3].1["result"]["content"][0]["text"], "body");
}

#[test]
fn a_permission_request_puts_the_call_in_pending_confirmation_with_the_agent_options() {
    let mut map = map();
    let request: RequestPermissionRequest = serde_json::from_value(json!({
        "sessionId": "acp1",
        "toolCall": {"toolCallId": "c2", "title": "Edit config", "kind": "edit"},
        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "reject", "name": "Skip", "kind": "reject_once"}],
    }))
    .expect("request");
    let actions = map.permission(&request);
    assert_eq!(
        kinds(&actions),
        ["chat/toolCallStart", "chat/toolCallReady"]
    );
    let ready = &actions[1].1;
    assert!(ready.get("confirmed").is_none());
    assert_eq!(ready["options"][0]["id"], "allow");
    assert_eq!(ready["options"][0]["kind"], "approve");
    assert_eq!(ready["options"][1]["kind"], "deny");
    // Until a client answers, a completion is not recorded.
    let done = update(
        json!({"sessionUpdate": "tool_call_update", "toolCallId": "c2", "status": "completed"}),
    );
    assert!(map.update("acp-1", &done).is_empty());
    map.confirmed("c2", true);
    assert_eq!(
        kinds(&map.update("acp-1", &done)),
        ["chat/toolCallComplete"]
    );
}

#[test]
fn the_stop_reason_completes_the_turn_and_later_updates_are_dropped() {
    let mut map = map();
    let end = map.finish(Ok(StopReason::EndTurn), 1_250);
    assert_eq!(kinds(&end), ["chat/turnComplete"]);
    assert_eq!(end[0].1["duration"], 250);
    let late = update(
        json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}),
    );
    assert!(map.update("acp-1", &late).is_empty());

    let mut map = self::map();
    let refused = map.finish(Ok(StopReason::Refusal), 1_000);
    assert_eq!(refused[0].1["part"]["error"]["errorType"], "refusal");
    let mut map = self::map();
    let failed = map.finish(Err("boom".into()), 1_000);
    assert_eq!(kinds(&failed), ["chat/error"]);
}

#[test]
fn commands_and_titles_go_to_the_session_channel() {
    let mut map = map();
    let commands = map.update("acp-1", &update(json!({"sessionUpdate": "available_commands_update",
        "availableCommands": [{"name": "web", "description": "Search", "input": {"hint": "query"}}]})));
    assert_eq!(commands[0].0, "ahp-session://s");
    assert_eq!(commands[0].1["type"], "session/metaChanged");
    assert_eq!(
        commands[0].1["_meta"]["tether/commands"][0]["inputHint"],
        "query"
    );
    let title = map.update(
        "acp-1",
        &update(json!({"sessionUpdate": "session_info_update", "title": "Fixing"})),
    );
    assert_eq!(
        title[0].1,
        json!({"type": "session/titleChanged", "title": "Fixing"})
    );
}

#[test]
fn only_the_loaded_sessions_updates_are_a_replay() {
    let mut map = map();
    assert!(!map.replays("acp-1"));
    map.replaying = Some("acp-1".to_owned());
    assert!(map.replays("acp-1"), "the session being loaded replays");
    assert!(!map.replays("acp-2"), "another chat's session streams on");
}
