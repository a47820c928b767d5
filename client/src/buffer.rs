//! Buffering a request body so that a retry layer can clone it. A tonic channel needs it:
//! `tonic::body::Body` cannot be cloned.

use bytes::{Buf, Bytes};
use http::{HeaderMap, Request};
use http_body::{Body, Frame, SizeHint};
use std::collections::VecDeque;
use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll};
use tower::BoxError;
use tower_layer::Layer;
use tower_service::Service;

/// Reads a request's body into memory when it is all there and fits. It sends the request on
/// with a [`BufferedBody`], which [`RetryPolicy`](crate::RetryPolicy) can clone for every
/// attempt.
///
/// It serves clients whose body type cannot be cloned, a tonic channel above all. Put it
/// between the stamping layer and the retry layer. Below the retry layer, turn the body back
/// into the channel's type:
///
/// ```no_run
/// use tower::ServiceBuilder;
/// use tower::retry::RetryLayer;
/// use tower_idempotency_client::{BufferRequestLayer, BufferedBody, RetryPolicy, StampKeyLayer};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let channel = tonic::transport::Channel::from_static("http://127.0.0.1:50051").connect_lazy();
/// let retrying = ServiceBuilder::new()
///     .layer(StampKeyLayer::new()) // one key per call
///     .layer(BufferRequestLayer::new()) // the request message(s) in memory
///     .layer(RetryLayer::new(RetryPolicy::new().keys_honoured_by_all())) // every attempt repeats both
///     .map_request(|req: http::Request<BufferedBody>| req.map(tonic::body::Body::new))
///     .service(channel);
/// // let client = OrdersClient::new(retrying);
/// # let _ = retrying;
/// # Ok(()) }
/// ```
///
/// **What is buffered.** The body's frames are read as long as they are ready at once. A body
/// that ends that way within the [`limit`](Self::limit) is held whole and can be retried. A
/// unary call's message is, and so is a client stream whose messages are all ready.
///
/// Any other body is a stream. It is still waiting for more: a client-streaming or
/// bidirectional call whose caller sends as it goes, or waits for an answer first. Or it grows
/// past the limit. A stream is sent on at once: what was read, then the rest as it comes. The
/// retry layer sends it **once**, and its response carries no [`Attempts`](crate::Attempts).
/// So the layer never holds more than the limit, and never waits for a caller's stream to end.
///
/// Errors become `tower::BoxError`: the body's, or the inner service's unchanged in the box.
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct BufferRequestLayer {
    limit: usize,
}

impl Default for BufferRequestLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl BufferRequestLayer {
    /// Buffers bodies of up to 1 MiB.
    pub fn new() -> Self {
        Self { limit: 1024 * 1024 }
    }

    /// The most bytes of one body held in memory. A longer body is streamed and not retried.
    /// `0` buffers only empty bodies.
    ///
    /// Default: 1 MiB, the server layer's default limit of a request body.
    pub fn limit(mut self, bytes: usize) -> Self {
        self.limit = bytes;
        self
    }
}

impl<S> Layer<S> for BufferRequestLayer {
    type Service = BufferRequest<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferRequest {
            inner,
            limit: self.limit,
        }
    }
}

/// The service of [`BufferRequestLayer`].
#[derive(Clone, Debug)]
pub struct BufferRequest<S> {
    inner: S,
    limit: usize,
}

impl<S> BufferRequest<S> {
    /// [`BufferRequestLayer::new`], as a shortcut.
    pub fn layer() -> BufferRequestLayer {
        BufferRequestLayer::new()
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// Put into the extensions of a request whose body is streamed. The retry policy keeps no copy
/// of it, so it is sent once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Streamed;

impl<S, B> Service<Request<B>> for BufferRequest<S>
where
    S: Service<Request<BufferedBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The service polled ready is the one that is called, after the body is read.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limit = self.limit;
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let body = read_ready(body, limit).await?;
            if body.is_streamed() {
                parts.extensions.insert(Streamed);
            }
            inner
                .call(Request::from_parts(parts, body))
                .await
                .map_err(Into::into)
        })
    }
}

/// Reads the frames of `body` that are ready now, up to `limit` bytes. The result is the whole
/// body if it ends that way, else what was read and the rest.
async fn read_ready<B>(body: B, limit: usize) -> Result<BufferedBody, BoxError>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut head = VecDeque::new();
    let mut size = 0usize;
    loop {
        let next = poll_fn(|cx| match body.as_mut().poll_frame(cx) {
            // Not ready: the caller is still sending; stop reading, never wait.
            Poll::Pending => Poll::Ready(None),
            Poll::Ready(frame) => Poll::Ready(Some(frame)),
        })
        .await;
        let frame = match next {
            None => break,
            Some(None) => return Ok(BufferedBody::whole(head)),
            Some(Some(frame)) => frame.map_err(Into::into)?,
        };
        let frame = frame.map_data(|mut d| d.copy_to_bytes(d.remaining()));
        if let Some(data) = frame.data_ref() {
            size = size.saturating_add(data.len());
        }
        head.push_back(frame);
        if size > limit {
            break;
        }
    }
    let rest = http_body_util::BodyExt::map_err(body, Into::into);
    let rest = http_body_util::BodyExt::map_frame(rest, |f| {
        f.map_data(|mut d| d.copy_to_bytes(d.remaining()))
    });
    Ok(BufferedBody {
        inner: Inner::Streamed {
            head,
            rest: Some(Box::pin(rest)),
        },
    })
}

/// The request body [`BufferRequestLayer`] sends on. It is held whole and cloned for each
/// attempt, or streamed and sent once.
///
/// A streamed body cannot be sent twice: its clone fails when read. The retry policy never
/// clones it.
pub struct BufferedBody {
    inner: Inner,
}

type Rest = Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send>>;

enum Inner {
    Whole {
        data: Bytes,
        trailers: Option<HeaderMap>,
        /// Whether the data frame has been yielded.
        sent: bool,
    },
    Streamed {
        head: VecDeque<Frame<Bytes>>,
        rest: Option<Rest>,
    },
}

impl BufferedBody {
    fn whole(frames: VecDeque<Frame<Bytes>>) -> Self {
        let mut data = bytes::BytesMut::new();
        let mut trailers: Option<HeaderMap> = None;
        for frame in frames {
            match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(frame) => {
                    if let Ok(t) = frame.into_trailers() {
                        trailers.get_or_insert_with(HeaderMap::new).extend(t);
                    }
                }
            }
        }
        Self {
            inner: Inner::Whole {
                data: data.freeze(),
                trailers,
                sent: false,
            },
        }
    }

    /// Whether the body is streamed: not held whole, sent once.
    #[must_use]
    pub fn is_streamed(&self) -> bool {
        matches!(self.inner, Inner::Streamed { .. })
    }
}

impl Clone for BufferedBody {
    fn clone(&self) -> Self {
        match &self.inner {
            Inner::Whole { data, trailers, .. } => Self {
                inner: Inner::Whole {
                    data: data.clone(),
                    trailers: trailers.clone(),
                    sent: false,
                },
            },
            Inner::Streamed { .. } => Self {
                inner: Inner::Streamed {
                    head: VecDeque::new(),
                    rest: None,
                },
            },
        }
    }
}

impl fmt::Debug for BufferedBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Whole { data, .. } => write!(f, "BufferedBody::Whole({} bytes)", data.len()),
            Inner::Streamed { .. } => f.write_str("BufferedBody::Streamed"),
        }
    }
}

impl Body for BufferedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().inner {
            Inner::Whole {
                data,
                trailers,
                sent,
            } => {
                if !*sent {
                    *sent = true;
                    if !data.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(data.clone()))));
                    }
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
            Inner::Streamed { head, rest } => {
                if let Some(frame) = head.pop_front() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                match rest {
                    Some(rest) => rest.as_mut().poll_frame(cx),
                    None => Poll::Ready(Some(Err(
                        "a streamed request body cannot be sent twice".into()
                    ))),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Whole {
                data,
                trailers,
                sent,
            } => (*sent || data.is_empty()) && trailers.is_none(),
            Inner::Streamed { head, rest } => {
                head.is_empty() && rest.as_ref().is_some_and(|r| r.is_end_stream())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Whole { data, sent, .. } => {
                SizeHint::with_exact(if *sent { 0 } else { len(data) })
            }
            Inner::Streamed { head, rest } => {
                let held = head
                    .iter()
                    .filter_map(Frame::data_ref)
                    .fold(0u64, |n, d| n.saturating_add(len(d)));
                let mut hint = rest
                    .as_ref()
                    .map_or_else(SizeHint::default, |r| r.size_hint());
                // The upper bound first: a lower bound may not pass it.
                if let Some(upper) = hint.upper() {
                    hint.set_upper(upper.saturating_add(held));
                }
                hint.set_lower(hint.lower().saturating_add(held));
                hint
            }
        }
    }
}

fn len(b: &Bytes) -> u64 {
    u64::try_from(b.len()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};
    use std::time::Duration;

    #[tokio::test]
    async fn a_ready_body_within_the_limit_is_held_whole_and_clones() {
        let body = read_ready(Full::new(Bytes::from_static(b"hello")), 16)
            .await
            .unwrap();
        assert!(!body.is_streamed());
        assert_eq!(body.size_hint().exact(), Some(5));
        let copy = body.clone();
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
        assert_eq!(copy.collect().await.unwrap().to_bytes(), "hello");
        let empty = read_ready(Full::new(Bytes::new()), 0).await.unwrap();
        assert!(!empty.is_streamed() && empty.is_end_stream());
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_streamed_with_every_byte() {
        let chunks = ["abc", "def", "ghi"].map(|c| Ok::<_, BoxError>(Frame::data(Bytes::from(c))));
        let body = StreamBody::new(tokio_stream::iter(chunks));
        let body = read_ready(body, 4).await.unwrap();
        assert!(body.is_streamed());
        assert!(
            body.clone().collect().await.is_err(),
            "a streamed body is sent once"
        );
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdefghi");
    }

    #[tokio::test]
    async fn a_body_that_waits_is_streamed_without_waiting() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(2);
        tx.send(Ok(Frame::data(Bytes::from_static(b"first"))))
            .await
            .unwrap();
        let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        let body = tokio::time::timeout(Duration::from_secs(5), read_ready(body, 1024))
            .await
            .expect("read_ready does not wait for the rest")
            .unwrap();
        assert!(body.is_streamed());
        tx.send(Ok(Frame::data(Bytes::from_static(b" second"))))
            .await
            .unwrap();
        drop(tx);
        assert_eq!(body.collect().await.unwrap().to_bytes(), "first second");
    }
}
