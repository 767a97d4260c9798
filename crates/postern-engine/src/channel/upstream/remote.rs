//! The HTTP client Postern speaks Streamable HTTP to a remote upstream with: rmcp's reqwest
//! client, which refuses to read an answer past the byte limits it is given (so nothing
//! unbounded is buffered), and this wrapper, which turns that refusal into what it is — an
//! answer larger than the limit, as the same JSON-RPC error [`super::frames`] gives a stdio
//! server's — instead of a broken stream that would leave the call's outcome unknown.

use crate::channel::oauth::{SignInNeeded, TokenSource};
use futures::{StreamExt, stream::BoxStream};
use http::{HeaderName, HeaderValue};
use postern_vault::Sensitive;
use rmcp::{
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::streamable_http_client::{
        SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
    },
};
use sse_stream::Sse;
use std::{collections::HashMap, sync::Arc};

/// rmcp's reqwest client with answers past the limit reported as such, and, for a server that
/// signs in with OAuth, its access token on every request: a request answered 401 (the server
/// refused it before acting on it) is sent once more with a refreshed token.
#[derive(Clone, Debug)]
pub struct CappedHttp {
    pub http: reqwest::Client,
    pub auth: Option<Arc<TokenSource>>,
}

/// The JSON-RPC error code of an answer that stands in for a request never sent because the
/// server needs a new sign-in (the request was refused before it reached the server's tool).
pub const SIGN_IN_NEEDED_CODE: i32 = -32041;

/// A random value of this process that marks the answers it makes up for requests it did not
/// send: a server never sees them, so it cannot make a request it received look unsent.
pub fn not_sent_marker() -> &'static str {
    static MARKER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MARKER.get_or_init(|| {
        let mut random = [0u8; 16];
        // Without randomness the marker is one no answer carries: nothing reads as not sent.
        match getrandom::fill(&mut random) {
            Ok(()) => hex::encode(random),
            Err(_) => String::from("\u{0}unavailable"),
        }
    })
}

/// The error answer that stands in for a request not sent because the server needs a sign-in.
fn sign_in_needed(id: &rmcp::model::RequestId, why: &SignInNeeded) -> Option<ServerJsonRpcMessage> {
    serde_json::from_value(serde_json::json!({
        "jsonrpc": "2.0", "id": id,
        "error": { "code": SIGN_IN_NEEDED_CODE, "message": why.to_string(),
                   "data": { "postern": "oauth_login_required", "not_sent": not_sent_marker() } },
    }))
    .ok()
}

/// The error answer that stands in for one past the limit, for request `id`.
fn too_large(id: &rmcp::model::RequestId, limit: usize) -> Option<ServerJsonRpcMessage> {
    serde_json::from_value(super::frames::too_large_answer(id, limit)).ok()
}

fn request_id(message: &ClientJsonRpcMessage) -> Option<rmcp::model::RequestId> {
    match message {
        ClientJsonRpcMessage::Request(request) => Some(request.id.clone()),
        _ => None,
    }
}

impl StreamableHttpClient for CappedHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let id = request_id(&message);
        let answer = match &self.auth {
            None => {
                self.http
                    .post_message_with_response_limits(
                        uri,
                        message,
                        session_id.clone(),
                        auth_header,
                        custom_headers,
                        limits,
                    )
                    .await
            }
            Some(auth) => {
                let token = match auth.access_token().await {
                    Ok(token) => token,
                    Err(why) => return self.not_sent(id.as_ref(), &why, session_id),
                };
                let post = |token: &Sensitive<String>| {
                    self.http.post_message_with_response_limits(
                        uri.clone(),
                        message.clone(),
                        session_id.clone(),
                        Some(token.expose().clone()),
                        custom_headers.clone(),
                        limits,
                    )
                };
                match post(&token).await {
                    // Refused before the server acted on it: the same request once more with a
                    // refreshed token (shared with every other request refused meanwhile).
                    Err(StreamableHttpError::AuthRequired(_)) => match auth.after_rejection(&token).await {
                        Ok(fresh) => match post(&fresh).await {
                            Err(StreamableHttpError::AuthRequired(_)) => {
                                let why = auth.refused_after_refresh();
                                return self.not_sent(id.as_ref(), &why, session_id);
                            }
                            answer => answer,
                        },
                        Err(why) => return self.not_sent(id.as_ref(), &why, session_id),
                    },
                    answer => answer,
                }
            }
        };
        match (answer, id) {
            (Err(StreamableHttpError::ResponseBodyTooLarge { max_size }), Some(id)) => match too_large(&id, max_size) {
                Some(error) => Ok(StreamableHttpPostResponse::Json(error, session_id.map(|s| s.to_string()))),
                None => Err(StreamableHttpError::ResponseBodyTooLarge { max_size }),
            },
            (Ok(StreamableHttpPostResponse::Sse(stream, session)), Some(id)) => {
                Ok(StreamableHttpPostResponse::Sse(capped_events(stream, id, limits.max_sse_event_size), session))
            }
            (answer, _) => answer,
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        let token = self.token(auth_header).await?;
        self.http.delete_session(uri, session_id, token, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        let token = self.token(auth_header).await?;
        self.http.get_stream(uri, session_id, last_event_id, token, custom_headers).await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        let token = self.token(auth_header).await?;
        self.http
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                token,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

impl CappedHttp {
    /// The bearer token of a request that is not a call (the standalone stream, the session's
    /// end).
    async fn token(&self, given: Option<String>) -> Result<Option<String>, StreamableHttpError<reqwest::Error>> {
        match &self.auth {
            None => Ok(given),
            Some(auth) => match auth.access_token().await {
                Ok(token) => Ok(Some(token.expose().clone())),
                Err(why) => Err(StreamableHttpError::UnexpectedServerResponse(why.to_string().into())),
            },
        }
    }

    /// The answer of a request that was not sent because the server needs a new sign-in.
    fn not_sent(
        &self,
        id: Option<&rmcp::model::RequestId>,
        why: &SignInNeeded,
        session_id: Option<Arc<str>>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>> {
        match id.and_then(|id| sign_in_needed(id, why)) {
            Some(answer) => Ok(StreamableHttpPostResponse::Json(answer, session_id.map(|s| s.to_string()))),
            None => Err(StreamableHttpError::UnexpectedServerResponse(why.to_string().into())),
        }
    }
}

/// The response stream of request `id`: an event rmcp refused as too large ends it with the
/// error answer for `id` instead of an error that reads as a broken stream.
fn capped_events(
    stream: BoxStream<'static, Result<Sse, SseError>>,
    id: rmcp::model::RequestId,
    limit: usize,
) -> BoxStream<'static, Result<Sse, SseError>> {
    let mut ended = false;
    stream
        .map(move |event| match event {
            Err(e) if !ended && e.to_string().contains("exceeded the maximum size") => {
                ended = true;
                let data = too_large(&id, limit).and_then(|m| serde_json::to_string(&m).ok());
                Ok(Sse { event: Some("message".into()), data, id: None, retry: None })
            }
            other => other,
        })
        .boxed()
}
