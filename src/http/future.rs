use super::body::ResponseBody;
use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

pin_project! {
    /// The response future of [`Idempotency`](super::Idempotency).
    ///
    /// Requests the layer does not act on (safe methods, no key when not required) poll the
    /// inner future directly; an immediate rejection is ready at once; a keyed request runs the
    /// claim → handler → record sequence in one boxed future.
    pub struct ResponseFuture<F, B, E> where B: Body {
        #[pin]
        state: State<F, B, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, E> where B: Body {
        Passthrough { #[pin] fut: F },
        Ready { res: Option<Response<ResponseBody<B>>> },
        Keyed { fut: BoxFuture<Result<Response<ResponseBody<B>>, E>>, span: tracing::Span },
    }
}

impl<F, B: Body, E> ResponseFuture<F, B, E> {
    pub(crate) fn passthrough(fut: F) -> Self {
        Self {
            state: State::Passthrough { fut },
        }
    }
    pub(crate) fn ready(res: Response<ResponseBody<B>>) -> Self {
        Self {
            state: State::Ready { res: Some(res) },
        }
    }
    pub(crate) fn keyed(
        fut: BoxFuture<Result<Response<ResponseBody<B>>, E>>,
        span: tracing::Span,
    ) -> Self {
        Self {
            state: State::Keyed { fut, span },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Passthrough { fut } => {
                let res = ready!(fut.poll(cx))?;
                Poll::Ready(Ok(res.map(ResponseBody::passthrough)))
            }
            StateProj::Ready { res } => Poll::Ready(Ok(res
                .take()
                .expect("ResponseFuture polled after completion"))),
            StateProj::Keyed { fut, span } => {
                let _entered = span.enter();
                let out = ready!(fut.as_mut().poll(cx));
                if let Ok(res) = &out {
                    span.record("http.response.status_code", res.status().as_u16());
                }
                Poll::Ready(out)
            }
        }
    }
}

impl<F, B: Body, E> std::fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
