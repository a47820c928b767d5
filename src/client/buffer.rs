//! Buffering a request body so that a retry layer can clone it: what a tonic channel needs,
//! since `tonic::body::Body` cannot be cloned.

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower::BoxError;
use tower_layer::Layer;
use tower_service::Service;

/// Reads a request's whole body into memory and sends the request on with a
/// `Full<Bytes>` body, which [`RetryPolicy`](super::RetryPolicy) can clone for every attempt.
///
/// For clients whose body type cannot be cloned, a tonic channel above all. Put it between
/// the stamping layer and the retry layer, and turn the body back into the channel's type
/// below the retry layer:
///
/// ```no_run
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use tower::ServiceBuilder;
/// use tower::retry::RetryLayer;
/// use tower_idempotency::client::{BufferRequestLayer, RetryPolicy, StampKeyLayer};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let channel = tonic::transport::Channel::from_static("http://127.0.0.1:50051").connect_lazy();
/// let retrying = ServiceBuilder::new()
///     .layer(StampKeyLayer::new()) // one key per call
///     .layer(BufferRequestLayer::new()) // the request message(s) in memory
///     .layer(RetryLayer::new(RetryPolicy::new())) // every attempt repeats both
///     .map_request(|req: http::Request<Full<Bytes>>| req.map(tonic::body::Body::new))
///     .service(channel);
/// // let client = OrdersClient::new(retrying);
/// # let _ = retrying;
/// # Ok(()) }
/// ```
///
/// The body is buffered whole, without a limit of its own: a client-streaming call is held
/// until the caller's stream ends, and a bidirectional call in which the caller waits for an
/// answer before it finishes sending would wait for ever. Use it for unary calls (and
/// server-streaming ones), the calls an idempotency key is for. Errors become
/// `tower::BoxError` (the body's, or the inner service's unchanged inside the box).
#[derive(Clone, Copy, Debug, Default)]
#[must_use]
pub struct BufferRequestLayer {
    _priv: (),
}

impl BufferRequestLayer {
    /// The layer.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<S> Layer<S> for BufferRequestLayer {
    type Service = BufferRequest<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferRequest { inner }
    }
}

/// The service of [`BufferRequestLayer`].
#[derive(Clone, Debug)]
pub struct BufferRequest<S> {
    inner: S,
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

impl<S, B> Service<Request<B>> for BufferRequest<S>
where
    S: Service<Request<Full<Bytes>>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
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
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
            inner
                .call(Request::from_parts(parts, Full::new(bytes)))
                .await
                .map_err(Into::into)
        })
    }
}
