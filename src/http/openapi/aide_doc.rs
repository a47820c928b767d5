//! The declarations of [`IdempotencyDoc`] on aide's OpenAPI types. Feature `aide`.

use super::{Answer, IdempotencyDoc, PROBLEM_JSON, display_name};
use crate::http::headers::REPLAYED_HEADER;
use aide::openapi::{
    Header, MediaType, Operation, Parameter, ReferenceOr, Response, SchemaObject, StatusCode,
};
use aide::transform::TransformOperation;
use serde_json::{Value, json};

impl IdempotencyDoc {
    /// Declares on an aide route's operation what [`aide_operation`](Self::aide_operation)
    /// does, as the transform of an `ApiRouter` route. Use it only on a route the layer acts
    /// on (POST, PUT, PATCH and DELETE by default).
    ///
    /// ```
    /// use aide::openapi::Operation;
    /// use aide::transform::TransformOperation;
    /// use tower_idempotency::IdempotencyLayer;
    /// use tower_idempotency::http::openapi::IdempotencyDoc;
    ///
    /// let doc = IdempotencyDoc::of(&IdempotencyLayer::default());
    /// // In an axum `ApiRouter`: `.api_route("/orders", post_with(create_order, |op| doc.transform(op)))`.
    /// let mut op = Operation::default();
    /// let _ = doc.transform(TransformOperation::new(&mut op));
    /// let json = serde_json::to_string(&op).unwrap();
    /// assert!(json.contains("Idempotency-Key"));
    /// assert!(json.contains("idempotency.key_reused"));
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "aide")))]
    pub fn transform<'t>(&self, mut op: TransformOperation<'t>) -> TransformOperation<'t> {
        self.aide_operation(op.inner_mut());
        op
    }

    /// Declares on an aide `operation` as [`operation`](Self::operation) does on a utoipa one:
    /// the key header, the problem answers and the replay header on each answer it declares
    /// that the layer replays. Responses given as references are left as they are.
    #[cfg_attr(docsrs, doc(cfg(feature = "aide")))]
    pub fn aide_operation(&self, operation: &mut Operation) {
        if let Some(header) = self.header.as_ref() {
            let name = display_name(header);
            operation.parameters.retain(|p| match p {
                ReferenceOr::Item(Parameter::Header { parameter_data, .. }) => {
                    !parameter_data.name.eq_ignore_ascii_case(&name)
                }
                _ => true,
            });
            let parameter = json!({
                "in": "header",
                "name": name,
                "required": self.required,
                "description": self.key_description(),
                "schema": {"type": "string", "minLength": 1, "maxLength": self.max_key_len},
            });
            if let Some(p) = from_json::<Parameter>(parameter) {
                operation.parameters.push(ReferenceOr::Item(p));
            }
        }
        let responses = operation.responses.get_or_insert_with(Default::default);
        let (values, description) = self.replayed();
        let replayed = from_json::<Header>(json!({
            "description": description,
            "schema": {"type": "string", "enum": values},
        }));
        for (status, response) in &mut responses.responses {
            if let (true, ReferenceOr::Item(response), Some(header)) = (
                self.carries_replay_header(&status.to_string()),
                response,
                &replayed,
            ) {
                response.headers.insert(
                    display_name(&REPLAYED_HEADER),
                    ReferenceOr::Item(header.clone()),
                );
            }
        }
        for answer in self.answers() {
            let response = responses
                .responses
                .entry(StatusCode::Code(answer.status.as_u16()))
                .or_insert_with(|| {
                    ReferenceOr::Item(Response {
                        description: self.answer_description(&answer),
                        ..Response::default()
                    })
                });
            let ReferenceOr::Item(response) = response else {
                continue;
            };
            if let Some(schema) = from_json::<SchemaObject>(problem_schema(&answer)) {
                response
                    .content
                    .entry(PROBLEM_JSON.to_owned())
                    .or_insert_with(|| MediaType {
                        schema: Some(schema),
                        ..MediaType::default()
                    });
            }
            if answer.retry_after()
                && let Some(header) = from_json::<Header>(json!({
                    "description": "Seconds to wait before retrying the same request.",
                    "schema": {"type": "integer", "minimum": 0},
                }))
            {
                response
                    .headers
                    .entry("Retry-After".to_owned())
                    .or_insert(ReferenceOr::Item(header));
            }
        }
    }
}

/// An RFC 9457 problem document with the crate's `code` field, limited to the answer's codes.
fn problem_schema(answer: &Answer) -> Value {
    json!({
        "type": "object",
        "properties": {
            "type": {"type": "string", "description": "A URI naming the case."},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "code": {
                "type": "string",
                "enum": answer.codes().collect::<Vec<_>>(),
                "description": "The stable machine code of the case.",
            },
        },
        "required": ["status", "code"],
    })
}

/// aide's types from their JSON: the shape is fixed here, so a failure is a defect, logged.
fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> Option<T> {
    serde_json::from_value(value)
        .map_err(|e| tracing::error!(error = %e, "an OpenAPI declaration did not build"))
        .ok()
}
