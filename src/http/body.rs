//! The request and response bodies the layer hands on, and the reading of a body up to a
//! limit. A request body is read to fingerprint it, a response body to record it.
//!
//! A response whose body streams on to the client before it has ended carries an [`EndHook`].
//! Its key is completed or released only once the body has ended or failed. The client sees
//! that end only once the key is settled.

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pin_project! {
    /// The request body the inner service sees. It is the caller's body untouched, or the bytes
    /// the layer buffered to fingerprint it.
    #[derive(Debug)]
    pub struct RequestBody<B> {
        #[pin]
        inner: RequestInner<B>,
    }
}

pin_project! {
    #[project = RequestInnerProj]
    #[derive(Debug)]
    enum RequestInner<B> {
        Passthrough { #[pin] body: B },
        Buffered { data: Option<Bytes> },
    }
}

impl<B> RequestBody<B> {
    pub(crate) fn passthrough(body: B) -> Self {
        Self {
            inner: RequestInner::Passthrough { body },
        }
    }

    pub(crate) fn buffered(data: Bytes) -> Self {
        Self {
            inner: RequestInner::Buffered {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().inner.project() {
            RequestInnerProj::Passthrough { body } => body.poll_frame(cx),
            RequestInnerProj::Buffered { data } => {
                Poll::Ready(data.take().map(|d| Ok(Frame::data(d))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            RequestInner::Passthrough { body } => body.is_end_stream(),
            RequestInner::Buffered { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            RequestInner::Passthrough { body } => body.size_hint(),
            RequestInner::Buffered { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

pin_project! {
    /// The response body the layer returns. It is the handler's body streamed untouched, or a
    /// buffered body: recorded, replayed or a rejection. Or it is what was buffered followed by
    /// the rest.
    pub struct ResponseBody<B> where B: Body {
        #[pin]
        inner: ResponseInner<B>,
        // Set when the key is settled by how this body ends.
        end: Option<EndState<B::Error>>,
    }
}

pin_project! {
    #[project = ResponseInnerProj]
    enum ResponseInner<B> where B: Body {
        Passthrough { #[pin] body: B },
        Buffered { data: Option<Bytes>, trailers: Option<HeaderMap> },
        // Bytes read while trying to record, then the rest of the handler's body.
        Prefixed { prefix: Option<Bytes>, rest: Pin<Box<B>> },
        // Bytes read before the handler's body failed, then its error.
        Failed { prefix: Option<Bytes>, error: Option<B::Error> },
    }
}

/// How a body whose key waits for its end ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyEnd {
    /// Every frame was produced.
    Ended,
    /// The body failed.
    Failed,
}

/// Ties a response body to the task that settles its key, by completing or releasing it. The
/// body reports how it ended, then waits for the task. So the client sees the end of the body,
/// or its failure, only once the key is settled. When dropped before the body ended, because
/// the client went away, it reports nothing. The task then sees the report channel closed.
#[derive(Debug)]
pub(crate) struct EndHook {
    report: Option<oneshot::Sender<BodyEnd>>,
    settled: JoinHandle<()>,
}

impl EndHook {
    /// A hook over the report channel of a settling task and the task itself.
    pub(crate) fn new(report: oneshot::Sender<BodyEnd>, settled: JoinHandle<()>) -> Self {
        Self {
            report: Some(report),
            settled,
        }
    }

    /// Reports `end` once, then waits until the key is settled.
    fn poll_settle(&mut self, end: BodyEnd, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(report) = self.report.take() {
            let _ = report.send(end);
        }
        // A task that panicked or was cancelled settles nothing more: the body ends anyway.
        Pin::new(&mut self.settled).poll(cx).map(|_| ())
    }
}

enum EndState<E> {
    /// Frames pass on, and the end has not been seen. `remaining` is the bytes still due of a body
    /// of exact length. Hyper stops polling a body once its declared length is written.
    Streaming {
        hook: EndHook,
        remaining: Option<u64>,
    },
    /// The body ended or failed. The frame that ended it waits here until the key is settled: its
    /// last data, its trailers, or its error.
    Settling {
        hook: EndHook,
        end: BodyEnd,
        last: Option<Result<Frame<Bytes>, E>>,
    },
    /// The end was passed on.
    Done,
}

impl<B: Body> ResponseBody<B> {
    fn new(inner: ResponseInner<B>) -> Self {
        Self { inner, end: None }
    }

    pub(crate) fn passthrough(body: B) -> Self {
        Self::new(ResponseInner::Passthrough { body })
    }

    pub(crate) fn buffered(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self::new(ResponseInner::Buffered {
            data: (!data.is_empty()).then_some(data),
            trailers,
        })
    }

    pub(crate) fn prefixed(prefix: Bytes, rest: Pin<Box<B>>) -> Self {
        Self::new(ResponseInner::Prefixed {
            prefix: (!prefix.is_empty()).then_some(prefix),
            rest,
        })
    }

    /// Takes the trailers out of a buffered body. A gRPC replay without messages sends them as
    /// the headers of a Trailers-Only response.
    pub(crate) fn take_trailers(&mut self) -> Option<HeaderMap> {
        match &mut self.inner {
            ResponseInner::Buffered { trailers, .. } => trailers.take(),
            _ => None,
        }
    }

    pub(crate) fn failed(prefix: Bytes, error: B::Error) -> Self {
        Self::new(ResponseInner::Failed {
            prefix: (!prefix.is_empty()).then_some(prefix),
            error: Some(error),
        })
    }
}

impl<B: Body<Data = Bytes>> ResponseBody<B> {
    /// The same body, its key settled by `hook` once it has ended or failed.
    pub(crate) fn settled_by(mut self, hook: EndHook) -> Self {
        let remaining = self.size_hint().exact();
        self.end = Some(EndState::Streaming { hook, remaining });
        self
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        loop {
            match this.end {
                None => return poll_inner(this.inner, cx),
                Some(EndState::Streaming { remaining, .. }) => {
                    // The end is the frame after which the body has nothing more. hyper may
                    // not poll again after the last byte of a declared length or after
                    // trailers, so that frame is held back until the key is settled.
                    let (end, last) = match ready!(poll_inner(this.inner.as_mut(), cx)) {
                        Some(Ok(frame)) => {
                            let at_end = match frame.data_ref() {
                                Some(data) => {
                                    if let Some(r) = remaining {
                                        *r = r.saturating_sub(data.len() as u64);
                                    }
                                    *remaining == Some(0) || inner_is_end(&this.inner)
                                }
                                None => frame.is_trailers(),
                            };
                            if !at_end {
                                return Poll::Ready(Some(Ok(frame)));
                            }
                            (BodyEnd::Ended, Some(Ok(frame)))
                        }
                        Some(Err(e)) => (BodyEnd::Failed, Some(Err(e))),
                        None => (BodyEnd::Ended, None),
                    };
                    if let Some(EndState::Streaming { hook, .. }) = this.end.take() {
                        *this.end = Some(EndState::Settling { hook, end, last });
                    }
                }
                Some(EndState::Settling { hook, end, last }) => {
                    ready!(hook.poll_settle(*end, cx));
                    let last = last.take();
                    *this.end = Some(EndState::Done);
                    return Poll::Ready(last);
                }
                Some(EndState::Done) => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.end {
            None => inner_is_end(&self.inner),
            Some(EndState::Done) => true,
            // The end is passed on only once the key is settled.
            Some(EndState::Streaming { .. } | EndState::Settling { .. }) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.end {
            None | Some(EndState::Streaming { .. }) => {}
            Some(EndState::Settling { last, .. }) => {
                let held = match last {
                    Some(Ok(frame)) => frame.data_ref().map_or(0, |d| d.len() as u64),
                    _ => 0,
                };
                return SizeHint::with_exact(held);
            }
            Some(EndState::Done) => return SizeHint::with_exact(0),
        }
        match &self.inner {
            ResponseInner::Passthrough { body } => body.size_hint(),
            ResponseInner::Buffered { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.remaining() as u64))
            }
            ResponseInner::Prefixed { prefix, rest } => {
                let p = prefix.as_ref().map_or(0, |d| d.len() as u64);
                let r = rest.size_hint();
                let mut h = SizeHint::new();
                h.set_lower(r.lower() + p);
                if let Some(u) = r.upper() {
                    h.set_upper(u + p);
                }
                h
            }
            ResponseInner::Failed { .. } => SizeHint::default(),
        }
    }
}

/// Whether a response body has nothing more, before any end hook.
fn inner_is_end<B: Body>(inner: &ResponseInner<B>) -> bool {
    match inner {
        ResponseInner::Passthrough { body } => body.is_end_stream(),
        ResponseInner::Buffered { data, trailers } => data.is_none() && trailers.is_none(),
        ResponseInner::Prefixed { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
        ResponseInner::Failed { prefix, error } => prefix.is_none() && error.is_none(),
    }
}

/// The frames of a response body, before any end hook.
fn poll_inner<B: Body<Data = Bytes>>(
    inner: Pin<&mut ResponseInner<B>>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
    match inner.project() {
        ResponseInnerProj::Passthrough { body } => body.poll_frame(cx),
        ResponseInnerProj::Buffered { data, trailers } => Poll::Ready(match data.take() {
            Some(d) => Some(Ok(Frame::data(d))),
            None => trailers.take().map(|t| Ok(Frame::trailers(t))),
        }),
        ResponseInnerProj::Prefixed { prefix, rest } => match prefix.take() {
            Some(p) => Poll::Ready(Some(Ok(Frame::data(p)))),
            None => rest.as_mut().poll_frame(cx),
        },
        ResponseInnerProj::Failed { prefix, error } => Poll::Ready(match prefix.take() {
            Some(p) => Some(Ok(Frame::data(p))),
            None => error.take().map(Err),
        }),
    }
}

impl<B: Body> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.inner {
            ResponseInner::Passthrough { .. } => "passthrough",
            ResponseInner::Buffered { .. } => "buffered",
            ResponseInner::Prefixed { .. } => "prefixed",
            ResponseInner::Failed { .. } => "failed",
        };
        let end = match &self.end {
            None => "none",
            Some(EndState::Streaming { .. }) => "streaming",
            Some(EndState::Settling { .. }) => "settling",
            Some(EndState::Done) => "done",
        };
        f.debug_struct("ResponseBody")
            .field("state", &state)
            .field("end", &end)
            .finish_non_exhaustive()
    }
}

/// Why a request body could not be buffered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// Over the limit.
    TooLarge,
    /// The body failed while read.
    Failed,
}

/// Reads a request body whole, up to `limit` bytes. Trailers are dropped.
pub(crate) async fn read_limited<B: Body<Data = Bytes>>(
    body: B,
    limit: usize,
) -> Result<Bytes, ReadError> {
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| ReadError::Failed)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        len += data.len();
        if len > limit {
            return Err(ReadError::TooLarge);
        }
        // One chunk is kept as is; only a body in several chunks is copied together.
        match first.take() {
            None if buf.is_empty() => first = Some(data),
            Some(f) => {
                buf.reserve(len);
                buf.extend_from_slice(&f);
                buf.extend_from_slice(&data);
            }
            None => buf.extend_from_slice(&data),
        }
    }
    Ok(first.unwrap_or_else(|| buf.freeze()))
}

/// A response body read up to a limit. It was read whole, with its trailers. Or it is what was
/// read before it grew over the limit, was still going at the deadline, or failed.
pub(crate) enum Collected<B: Body> {
    Whole {
        data: Bytes,
        trailers: Option<HeaderMap>,
    },
    TooLarge {
        prefix: Bytes,
        rest: Pin<Box<B>>,
    },
    /// Not ended by the deadline.
    Slow {
        prefix: Bytes,
        rest: Pin<Box<B>>,
    },
    Failed {
        prefix: Bytes,
        error: B::Error,
    },
}

/// Reads a response body up to `limit` bytes, keeping its trailers. It stops at the first byte
/// over the limit. It also stops when the body has not ended `timeout` after it first had to
/// be waited for. Then it hands back what it read and the rest.
///
/// The bound starts when the body first makes the reader wait, not before. A body whose frames
/// are all ready at once, as a buffered handler's, is read without a clock reading or a timer.
pub(crate) async fn collect_limited<B: Body<Data = Bytes>>(
    body: B,
    limit: usize,
    timeout: std::time::Duration,
) -> Collected<B> {
    let mut body = Box::pin(body);
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    let mut len = 0usize;
    let mut trailers: Option<HeaderMap> = None;
    // Made when the body first has to be waited for (boxed: the rare path does not size
    // every response's future).
    let mut bound: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let take = |first: &mut Option<Bytes>, buf: &mut BytesMut| {
        first.take().unwrap_or_else(|| std::mem::take(buf).freeze())
    };
    loop {
        let next = std::future::poll_fn(|cx| {
            if let Poll::Ready(next) = body.as_mut().poll_frame(cx) {
                return Poll::Ready(Some(next));
            }
            // Trailers are the last frame: once they came the end is due, the bound is moot.
            if trailers.is_some() {
                return Poll::Pending;
            }
            let bound = bound.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
            bound.as_mut().poll(cx).map(|()| None)
        })
        .await;
        let Some(next) = next else {
            return Collected::Slow {
                prefix: take(&mut first, &mut buf),
                rest: body,
            };
        };
        let Some(frame) = next else { break };
        let frame = match frame {
            Ok(f) => f,
            Err(error) => {
                return Collected::Failed {
                    prefix: take(&mut first, &mut buf),
                    error,
                };
            }
        };
        let data = match frame.into_data() {
            Ok(d) => d,
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    match &mut trailers {
                        Some(all) => all.extend(t),
                        None => trailers = Some(t),
                    }
                }
                continue;
            }
        };
        len += data.len();
        match first.take() {
            None if buf.is_empty() => first = Some(data),
            Some(f) => {
                buf.reserve(len);
                buf.extend_from_slice(&f);
                buf.extend_from_slice(&data);
            }
            None => buf.extend_from_slice(&data),
        }
        if len > limit {
            return Collected::TooLarge {
                prefix: take(&mut first, &mut buf),
                rest: body,
            };
        }
    }
    Collected::Whole {
        data: take(&mut first, &mut buf),
        trailers,
    }
}
