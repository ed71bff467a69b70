"""The outermost layer: the Flask app with its routes and guards, built by create_app(config), and gunicorn's response writer."""
