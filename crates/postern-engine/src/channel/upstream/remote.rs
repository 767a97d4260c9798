//! The HTTP client Postern speaks Streamable HTTP to a remote upstream with: rmcp's reqwest
//! client, which refuses to read an answer past the byte limits it is given (so nothing
//! unbounded is buffered), and this wrapper, which turns that refusal into what it is — an
//! answer larger than the limit, as the same JSON-RPC error [`super::frames`] gives a stdio
//! server's — instead of a broken stream that would leave the call's outcome unknown.

use futures::{StreamExt, stream::BoxStream};
use http::{HeaderName, HeaderValue};
use rmcp::{
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::streamable_http_client::{
        SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
    },
};
use sse_stream::Sse;
use std::{collections::HashMap, sync::Arc};

/// rmcp's reqwest client with answers past the limit reported as such.
#[derive(Clone, Debug)]
pub struct CappedHttp(pub reqwest::Client);

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
        let answer = self
            .0
            .post_message_with_response_limits(uri, message, session_id.clone(), auth_header, custom_headers, limits)
            .await;
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
        self.0.delete_session(uri, session_id, auth_header, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        self.0.get_stream(uri, session_id, last_event_id, auth_header, custom_headers).await
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
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
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
